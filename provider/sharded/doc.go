// Package sharded is the authority store over several etcd clusters: one
// provider/etcd Store per shard (each cluster with its own client settings,
// TLS, credentials and namespace), every row in the shard its key hashes to.
// It implements authority.Store, authority.ChangeWaiter, authority.RowFeed
// and authority.FeedPositioner, and offers owner leases (Registry) and a
// relocation blob store like the etcd provider's.
//
// # Shard map
//
// A row's shard is HashName's function of its authority key: FNV-1a (64
// bits) of the key's bytes, then the jump consistent hash onto the shard
// count. Every key the store writes for a row — the row, its capacity
// entry, its owner index entry, its reservation and creation terminals —
// lives in the row's shard, so every single-row operation (read, reserve,
// commit, completeCreation, abort, compare-exchange, WaitForChange) is one
// Txn in one cluster, with exactly the etcd provider's fencing (row
// version, owner liveness, reservation, capacity epoch).
//
// The map — the shards in order, each one's cluster ID and namespace, the
// hash's name and the map's epoch — is stored in every shard's namespace
// (the key ns/shard-map/current, bytes in provider/etcd/schema) and checked
// by New in every shard: a shard holding another map refuses the open with
// ErrShardMapMismatch naming the shard and the difference. Where no shard
// holds one, New writes it in each shard in a Txn that holds only while
// that namespace has no map and no row (a row placed without the map could
// be in the wrong shard); two stores racing to create different maps leave
// one map everywhere and the other store refused. A store of one shard
// over a namespace without a map writes nothing: a namespace written by the
// single-cluster store is the one-shard case, opened as it is, and that
// store keeps working beside this one (same rows, owner generations, blobs,
// cluster ID, feed revisions). A read-only store (Config.ReadOnly) never
// writes a map.
//
// The epoch is there for resharding (issue 43): a resharding job writes a
// new map with a higher epoch. This store checks the map only at New; the
// fence that stops a store of the old map from writing after a reshard (a
// compare on the map key in every write Txn) is issue 43's, and so is
// refusing a single-cluster store opened directly on one shard's namespace
// of a map of several shards (it would place rows without the map: open
// shards only through this package).
//
// # Owner leases
//
// An owner holds one etcd owner lease in every shard, each with the owner's
// liveness key there, on which that shard's writes of the owner's rows
// fence. Registry.Acquire takes the next generation in the owner's home
// shard (OwnerHome: the hash of its ID), then the same generation in every
// other shard (etcd.Registry.AcquireGeneration, whose Txn holds only while
// the generation is above the last one handed out there), so a token means
// the same lease generation in every shard and generations rise in each. A
// shard that already handed out a later generation refuses
// (etcd.ErrGenerationTaken): Acquire revokes what it took and fails; call it
// again. The owner is live only while every shard's lease is: OwnerLease.Done
// closes when any of them is lost, and the others are revoked at once, so
// the owner's writes fail in every shard (at the latest when their TTL runs
// out). RebindRows and RemoveAllByOwner run in every shard in parallel and
// sum what they moved or removed; a shard that fails is named, the others'
// work stays done, and calling again is idempotent.
//
// # Capacity
//
// A node's capacity entries live with its rows, in every shard;
// CapacityUsage sums the shards. Over several shards a capacity policy holds
// across them by capacity escrow (package escrow, O'Neil's method): every
// shard's store runs in escrow mode and admits a placement only within its
// own slice of the node's budget (a compare in its reservation Txn), and
// the store's mover moves budget between shards in fenced, idempotent steps
// when a slice runs short, asking the policy only for budget on top of what
// every shard already holds. So the limit holds over all shards at once,
// with no cross-shard step while a slice has room. SetCapacityPolicy sets
// the policy in every shard and reclaims every shard's unused budget (a
// lowered limit applies at once); the store finishes transfers a stopped
// mover left every Config.ReconcileInterval (ReconcileEscrow). The policy
// must be monotone on requested + reserved + active per counter; it is shown
// one shard's usage or the budget granted, never the node's usage over
// every shard (docs/deviations.md D1, B1–B4). A store of one shard takes a
// policy as the etcd store does, without escrow.
//
// # Aggregates
//
// An aggregate whose participants all live in one shard is that shard's
// store's aggregate: record, target capacity and participants in one
// cluster, prepared and committed in one Txn each. One whose participants
// live in several shards runs the two-phase protocol (package twophase): its
// record in the aggregate ID's coordinator shard (CoordinatorOf), the target
// capacity reserved in each shard its commit moves rows into, every
// participant row locked while its commit decides, and any store instance
// finishing or rolling back an aggregate whose coordinator stopped. Every
// shard must be finalized to storeversion.RowLocks for it.
// Config.RefuseCrossShardAggregates refuses such aggregates instead
// (ErrInvalidArgument and ErrCrossShardAggregate naming the shards and
// their participants, nothing written). PrepareAggregate refuses a fence
// already recorded in another shard (KindConflict: one fence, one record),
// and CommitAggregate and AbortAggregate find the record (the shard this
// store prepared it in, else every shard's record key read in parallel,
// else the coordinator shard).
//
// A write of an existing row (CompareExchangeAuthority, RemoveAllByOwner,
// OwnerLease.RebindRows, a commit of an aggregate of one shard) that meets
// a row lock resolves it (finishes or takes over its aggregate) and writes
// again; ReadAuthority applies a committed aggregate's rows before it
// answers. Listings and the row feed show each shard's rows as stored
// (docs/deviations.md X4).
//
// # Row numbers
//
// Over several shards a row's StoreVersion, object generation, owner
// generation and ownership token are its shard's revision × VersionStride
// + the shard's index: unique across shards, rising within each
// (rowversion.go). Over one shard they are the cluster's revisions.
//
// # Reads across shards
//
// ListAuthorities asks every shard that may still hold rows for a page
// after the last key returned, each at its own revision, and returns the
// first limit of their merge in key order; the cursor carries the last key
// and each shard's revision (or that it is done) inside the contract's
// cursor. Each shard's part is a snapshot of that shard; KindScanExpired
// when any shard compacted past its revision. A page costs up to
// limit × shards rows read. ReadCreationTerminal reads every shard (the
// operation names no row). A relocation blob lives in one shard (taken in
// turn; its reference names it).
//
// The row feed is one etcd feed per shard, merged as their batches arrive
// (changes of different shards are not ordered: no Txn spans two clusters).
// Its position is one revision per shard (FeedBatch.Position), a batch's
// Revision the sum; FeedRequest.AfterPosition resumes it, and FeedPosition
// reads the store's position, each shard's revision linearizably. Package
// view waits for a position on such a store, so its consistent reads stay
// linearizable over shards.
//
// # Everything else
//
// New opens every shard's store, so the process is announced in every
// shard's namespace; Finalize moves every shard's active store version
// (checking every shard first), and each shard gates its own writes.
// Every shard's metrics carry the label shard, its spans the attribute
// authority.shard (ShardAttribute), its log records the attribute shard.
// ClusterID names the shard set for fencing.Guard.ForCluster (over one
// shard, that cluster's ID).
package sharded
