// Package escrow keeps a node's capacity limit exact over the shards of a
// namespace spread across several etcd clusters, without a cross-shard
// commit on the hot path: O'Neil's escrow method (The Escrow Transactional
// Method, TODS 1986), with budgets moved between clusters in fenced,
// idempotent steps.
//
// # The pieces
//
// Each shard is one provider/etcd Store in escrow mode
// (etcdstore.Config.CapacityEscrow). For every node lifecycle N:
//
//   - each shard s holds N's budget slice (schema.BudgetSlice): Received and
//     Returned, cumulative counts per capacity counter; the slice is
//     Received - Returned. A reservation or aggregate prepare on N in s is
//     admitted only if s's usage of N (reserved + active) plus the request
//     fits the slice, counter by counter, and its Txn compares the slice's
//     ModRevision next to N's capacity epoch;
//   - N's home shard (Config.Home, by default a hash of the node; a sharded
//     store's is HomeOf its map, which stays when a resharding grows the
//     map) holds N's ledger (schema.BudgetLedger): per shard, Given and Taken, cumulative.
//     Granted = Σ over shards of Given - Taken;
//   - the Mover moves budget: Grow (a shard's slice is short), Reconcile
//     (finish transfers left in flight) and Reclaim (give slack back).
//
// Moving budget into shard s: Grant (one Txn in the home shard, fenced on
// the ledger's ModRevision: Given[s] += ask, only if the capacity policy
// admits ask on top of Granted), then Receive (one Txn in s, fenced on the
// slice's ModRevision: Received := max(Received, Given[s])). Moving it out:
// Release (one Txn in s, fenced on the slice and on N's capacity epoch:
// Returned += the slack, slice - usage, read at the epoch), then Credit (one
// Txn in the home shard, fenced on the ledger: Taken[s] := max(Taken[s],
// Returned)). Receive and Credit copy a figure rather than add one, so
// running either twice, or an older figure after a newer one, changes
// nothing: any mover may finish a transfer another one started.
//
// # Why the limit holds across shards (the fencing argument)
//
// Claim: at every moment, for every node lifecycle and counter, the usage
// summed over all shards is at most the ledger's Granted, and every value
// Granted takes is one the policy admitted.
//
//  1. In each shard, usage ≤ slice at every revision. Usage grows only by a
//     reservation or an aggregate prepare, which checks usage + request ≤
//     slice on a read and commits only if N's capacity epoch (moved by
//     every capacity change) and the slice's ModRevision are still those of
//     that read. The slice shrinks only by Release, which computes the slack
//     on a read and commits only if the epoch and the slice are unchanged.
//     So neither can commit on a stale read of the other; Receive only
//     grows the slice.
//  2. slice[s] ≤ Given[s] - Taken[s] at every moment. Received only takes
//     values Given[s] had earlier, Taken[s] only values Returned had
//     earlier, and all four counts never decrease: so Received ≤ Given[s]
//     and Taken[s] ≤ Returned, now.
//  3. Summing 1 and 2 over shards: total usage ≤ Granted.
//  4. Granted grows only by Grant, whose Txn commits only if the ledger is
//     the one it read, so the policy was asked about exactly the Granted the
//     grant adds to. Granted shrinks only by Credit.
//
// Under the assumption below, a total at most an admitted one is admitted:
// the usage never exceeds what the policy admits on one cluster. A crash,
// a timeout of unknown outcome or a cancelled context between two steps
// leaves Granted above the slices (budget counted, in no slice): capacity
// under-used until the transfer is finished, never over-admitted.
//
// # What "exact" means
//
// Never over: the claim above, at every moment, under any concurrency and
// any crash. Never under, when nothing else moves: a request of r on N in
// shard s is refused (placementCapacityExhausted; an aggregate prepare:
// conflict) only when (a) the policy refuses r on s's own usage, or (b) its
// Grow asked the ledger, after a reclaim (every transfer of N in flight
// finished, every shard's slack, s's included, given back), and the policy
// refused r's shortfall on top of Granted. If no other operation on N runs
// concurrently with that Grow, Granted is then exactly N's usage over all
// shards, and the refusal is the one a single cluster would give. With
// concurrent operations on N, Granted may also hold budget that other
// requests hold while in flight: a grant to another shard made after the
// reclaim (for its waiting requests, and Chunk-1 times as many ahead), and capacity freed
// in another shard after its release (an abort there). That budget is
// released by the next reclaim; it is why the figure of the faults-style
// test is taken with every writer going until refused.
//
// # Availability
//
// A reservation that fits its shard's slice needs only its own shard. A
// grow needs the node's home shard, a reclaim every shard holding budget of
// the node: while the home shard is down, reservations in the other shards
// on the nodes homed there fail with ErrUnavailable once their slices run
// out (a slice granted 2^31-1 because the policy does not limit its
// counters never does).
//
// # Assumption on the capacity policy
//
// The ledger asks the policy with the granted total as currentReserved and
// nothing active, and it asks for a shortfall (a vector of the request's
// shape, counters it already fits left at 0). So escrow assumes the policy
// decides on requested + reserved + active per counter it is shown, and is
// monotone: when it admits a total, it admits every total at most that one
// on each counter. Limits per counter (conformance.ActorLimit, a limit per
// Spot type, a total of actors and spots) satisfy it. A policy that treats
// reserved and active differently, or refuses small requests it would
// admit inside large ones, does not: under escrow it decides on the budget.
// Every shard's store must have the same policy; the home shard's decides
// grants. Lowering a limit takes effect for the budget still to be granted:
// slack already in slices stays usable until Reclaim (or ReconcileAll with
// reclaim) gives it back.
//
// # Resharding: budgets follow the moved rows
//
// A resharding (package provider/sharded/reshard) appends a cluster to the
// map and moves rows into it. Homes do not move: a sharded store's Home is
// HomeOf its map, HomeShard over the map's Homes(), which every grown map
// keeps: the shard count of a map created with several shards, 1 (shard 0)
// in a namespace that grew from one cluster. A store
// following the grown map adds the new shard to its mover (AddShard), its
// store opened with Hook(n). The limit holds across the move:
//
//   - First growth, at the switch: over one cluster, stores without escrow
//     (without Spares, or of an earlier build) admitted placements on the
//     cluster's usage alone, which may lie beyond N's slice there. Over one
//     shard that is exact (a grow asks for the slice's lack next to all the
//     usage, so Granted covers it before the policy decides); with a second
//     shard a grow there would not count it. Once the source is frozen
//     (every write routed before fails its map fence; a store without
//     Spares cannot route again) and before the grown map is in force
//     anywhere, the job gives each node lifecycle's slice what it lacks for
//     the usage, from the ledger, without asking the policy (which
//     admitted that usage). A concurrent grow covering it too counts it
//     twice: only above the truth, until a reclaim.
//   - Copy to switch: the job copies a moved row's capacity key into the
//     new cluster without any slice check, but no placement there is
//     admitted before the switch; the source still counts the row.
//   - Switch to cleanup: the row's capacity is in both clusters: in the
//     source as a stale copy (no write reaches it; its slice still covers
//     it) and in the new cluster, whose slice lacks it. A placement in the
//     new cluster asks the ledger for its usage beyond the slice, moved
//     rows included: counted twice, conservative. Claim 3 holds with the
//     stale copies in the sources' usage.
//   - Cleanup, per node lifecycle: the job first covers the new cluster's
//     slice: the ledger gives it what its usage lacks, at most what the
//     sources' stale copies hold, without asking the policy (Granted then
//     counts the moved rows twice: only above the truth). Then each source
//     deletes its stale copies and, in the same Txn, returns their budget
//     from its slice (Returned += their capacity; etcd
//     Moves.DeleteMovedCapacity), so the freed budget never shows as slack
//     a source could admit into; the ledger is credited. Granted is back
//     to what the policy admitted, the new cluster's slice holding the
//     moved rows' part.
//
// Deleting the stale copies without the return would leave slack in the
// sources that a reclaim hands back to the ledger while the new cluster's
// usage stays outside every slice: the next grants would not count it
// (TestEscrowFollowsGrowth over-admits without it). The cover is bounded
// by the stale copies the sources still hold: a cover above what they
// return would be budget no policy admitted. The job deletes the moved
// rows and owner index entries first, so nothing but this step deletes a
// stale copy afterwards.
//
// # Using it
//
// The sharded store builds one Mover for its shard map, gives each shard's
// Config the mover's Hook(i), opens the stores, and attaches each one's
// Budget():
//
//	m, err := escrow.New(escrow.Config{Shards: len(clusters), Home: homeOf}) // HomeOf the map in force
//	for i := range clusters {
//		cfg[i].CapacityPolicy = policy
//		cfg[i].CapacityEscrow = m.Hook(i)
//		stores[i], err = etcdstore.New(ctx, cfg[i])
//		err = m.Attach(i, stores[i].Budget())
//	}
//	// now and then, and after lowering a limit (reclaim true):
//	visited, err := m.ReconcileAll(ctx, false)
//
// A sharded store runs it over several shards, and over one shard when it
// has Spares (so that its placements are in N's budget when the map grows,
// and it follows the growth with its policy); without Spares a one-shard
// store runs without escrow, as a single-cluster store does. Every store
// writing a shard of a namespace of several shards must run in escrow
// mode: one that does not checks no slice.
package escrow
