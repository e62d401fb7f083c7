// Package reshard grows a running sharded namespace (package
// provider/sharded) by one etcd cluster, while every store keeps writing:
// from one cluster to two, from two to three, and so on. The shard map's
// hash (a jump consistent hash) moves only the rows whose shard under the
// next map is the new cluster, about 1/(n+1) of them.
//
// The job, after Vitess's resharding (copy, catch up from the change
// stream, switch) and Orleans' directory ranges handed over under a
// versioned lock:
//
//  1. Pending: the move (the map in force, epoch e, and the next map, epoch
//     e+1 with one more cluster) is written in every cluster. Stores keep
//     routing by the map in force, and take an owner lease in the new
//     cluster for each of their owners.
//  2. Copying: the new cluster's revision is raised above each source's
//     (so that a copied row's version and token there are above every one a
//     client saw), then every key of every row that moves (the row, its
//     owner index entry, its capacity entry) and every terminal is copied,
//     each Txn fenced on the job's claim and on each key's ModRevision.
//  3. Catching up: each source's changes are followed from the listing's
//     revision and applied in the same way, the new cluster's revision kept
//     above the changes' revisions.
//  4. Switching: once the copy lags little, each source is frozen (its map
//     key is put again, so every write routed before fails its map fence,
//     and the switching key makes stores refuse writes of the rows that
//     move with ErrMoving), prepared aggregates of moving rows are
//     aborted (those across shards through the two-phase protocol) and
//     every row lock left on a moving row is resolved (aggregates.go), the
//     last changes are applied, the owner generations are
//     copied, the switch is decided in the job record, and the next map is
//     put in force in the new cluster, then in every source.
//  5. Switched: the moved keys are deleted from the sources.
//
// The job's progress is its record in the new cluster (Run resumes from
// it after any crash), and one process runs it at a time (a lease-bound
// claim, on which every write into the new cluster fences). Pause stops it
// at its next step; Abort, before the switch is decided, undoes the move:
// the map in force stays and the copies are deleted. docs/operations.md,
// "Adding a cluster", is the procedure; docs/scale.md gives the figures.
package reshard
