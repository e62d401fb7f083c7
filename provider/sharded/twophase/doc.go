// Package twophase commits aggregates whose participant rows live in several
// etcd clusters (shards) all or nothing: a two-phase protocol with one
// decision record, over the cross-shard side of each shard's store
// (etcd.CrossShard).
//
// A sharded store (package provider/sharded) builds one Coordinator over its
// shards and a Router, and calls it for PrepareAggregate, CommitAggregate and
// AbortAggregate, for ReadAuthority, and around every other write of an
// existing row (Retry), which may find the row locked:
//
//	shards := []twophase.Shard{twophase.EtcdShard(s0), twophase.EtcdShard(s1), …}
//	coord, err := twophase.New(shards, router) // router: ShardOf(key), CoordinatorOf(aggregateID)
//
//	PrepareAggregate(ctx, req)    → coord.PrepareAggregate(ctx, req)
//	CommitAggregate(ctx, fence)   → coord.CommitAggregate(ctx, fence)
//	AbortAggregate(ctx, fence)    → coord.AbortAggregate(ctx, fence)
//	ReadAuthority(ctx, key)       → coord.ReadAuthority(ctx, key)
//	CompareExchangeAuthority(…)   → coord.Retry(ctx, func(ctx context.Context) error {
//	                                    res, err = shardOf(key).CompareExchangeAuthority(ctx, key, v, m); return err })
//	RemoveAllByOwner(ctx, owner)  → per shard: coord.Retry(ctx, func(ctx context.Context) error {
//	                                    n, err := shard.RemoveAllByOwner(ctx, owner); total += n; return err })
//	OwnerLease.RebindRows(ctx, f) → per shard, the same with that shard's lease
//
// Reserve, Commit, Abort and CompleteCreation of a reservation need no Retry:
// a reserved or absent row is never locked. Every shard's namespace must be
// finalized to storeversion.RowLocks (etcd.ErrNotFinalized otherwise, at the
// prepare, nothing written). A store of one cluster never needs this package.
//
// # The protocol
//
//   - Prepare. The record lives in the coordinator shard (Router.CoordinatorOf
//     the aggregate ID). An aggregate whose participants all live there is
//     prepared, committed and aborted as in one store (one Txn each). Any
//     other: each participant shard reads its rows and their owners'
//     liveness (etcd.CrossShard.CheckParticipants); the coordinator shard
//     writes the prepared record with a random incarnation and reserves its
//     part of the target's capacity (what the commit moves into it), in one
//     Txn fenced as a prepare of one store is (PrepareCrossShard); then
//     every other shard the commit moves rows into reserves its part
//     (ReservePart, parts.go). A part refused aborts the aggregate,
//     releases its parts and withdraws the record: conflict.
//   - Commit, phase 1 (lock). A commit attempt (a random ID, and the record
//     revision it started from: its base) locks, in each participant shard
//     and in one Txn, every participant row of that shard: it compares each
//     row's version with the expected one and the liveness of the owner the
//     commit needs, and puts the row's lock (a key of its own,
//     schema.Layout.RowLock), which every write of an existing row compares
//     absent (storeversion.RowLocks); the Txn also compares the shard's
//     part reserved (a part a stopped prepare left missing is reserved
//     first).
//   - Decision. With every shard locked, the record moves to committed in one
//     Txn comparing its revision with the attempt's base: the single decision
//     point. A shard found stale (a row changed, an owner not live) releases
//     the attempt's locks and the commit answers stale, the record still
//     prepared (as a commit in one store answers).
//   - Phase 2 (apply). Each participant shard applies its part in one Txn
//     comparing its locks, deletes them and turns its reserved capacity
//     into the moved rows' entries; then the coordinator shard finishes the
//     record (it expires).
//   - Abort: the record moves to aborted (releasing the coordinator shard's
//     part), then every shard releases the incarnation's locks and its
//     part, then the record is finished.
//
// # Recovery
//
// Any store instance finishes or rolls back an aggregate left by a
// coordinator that died at any step: a writer that meets a lock (Retry), a
// reader (ReadAuthority), a commit or abort of the same fence, or another
// aggregate's commit, reads the record the lock names and acts on it:
// committed → apply every shard, finish; aborted → release every shard,
// finish; missing or another incarnation → release the lock; prepared → the
// lock's attempt may still decide: a writer takes the record over (rewrites
// it unchanged, so no attempt of the old base can decide) and releases the
// lock, leaving the aggregate prepared; a reader answers the row as read.
// Every step is idempotent, so a retry after an unknown outcome is safe.
//
// # Resharding
//
// A growth of the shard map (package provider/sharded/reshard) moves rows
// but never a record: the coordinator shard is a hash over the map's home
// shards, which every growth keeps. A row lock, a capacity part and a part
// marker do not move either: with its sources frozen, the switch runs this
// protocol over them (each call fenced on the frozen map) to abort every
// prepared aggregate with a participant that moves and to resolve every
// lock left on a moving row, before the rows' last changes are copied.
package twophase
