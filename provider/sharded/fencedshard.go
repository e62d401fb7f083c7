package sharded

import (
	"context"

	authority "github.com/zlink-systems/authority"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/sharded/twophase"
)

// fencedShard is a shard of a topology as the two-phase protocol uses it:
// every call carries the shard's map fence (etcd.WithShardMapRevision), so
// the protocol's writes hold only under the map they were routed by, as the
// store's own writes do.
type fencedShard struct {
	twophase.Shard
	st  *etcdstore.Store
	rev int64
}

// FencedShard returns st as a shard of the two-phase protocol whose every
// call is fenced on st's shard map key at rev (etcd.WithShardMapRevision):
// for a tool that finishes aggregates under a map it holds, as a
// resharding's switch does over its frozen sources (package reshard).
func FencedShard(st *etcdstore.Store, rev int64) twophase.Shard {
	return fencedShard{twophase.EtcdShard(st), st, rev}
}

func (f fencedShard) at(ctx context.Context) context.Context {
	return f.st.WithShardMapRevision(ctx, f.rev)
}

func (f fencedShard) PrepareAggregate(ctx context.Context, req authority.AggregatePrepareRequest) (authority.PrepareAggregateResult, error) {
	return f.Shard.PrepareAggregate(f.at(ctx), req)
}

func (f fencedShard) CommitAggregate(ctx context.Context, fence authority.Fence) (authority.CommitAggregateResult, error) {
	return f.Shard.CommitAggregate(f.at(ctx), fence)
}

func (f fencedShard) AbortAggregate(ctx context.Context, fence authority.Fence) (authority.AbortAggregateResult, error) {
	return f.Shard.AbortAggregate(f.at(ctx), fence)
}

func (f fencedShard) PrepareCrossShard(ctx context.Context, req authority.AggregatePrepareRequest, foreign []etcdstore.ParticipantCheck) (authority.PrepareAggregateResult, error) {
	return f.Shard.PrepareCrossShard(f.at(ctx), req, foreign)
}

func (f fencedShard) ReadRecord(ctx context.Context, fence authority.Fence) (*etcdstore.CrossRecord, error) {
	return f.Shard.ReadRecord(f.at(ctx), fence)
}

func (f fencedShard) TakeOver(ctx context.Context, rec *etcdstore.CrossRecord) (*etcdstore.CrossRecord, bool, error) {
	return f.Shard.TakeOver(f.at(ctx), rec)
}

func (f fencedShard) Decide(ctx context.Context, rec *etcdstore.CrossRecord, commit bool) (*etcdstore.CrossRecord, bool, error) {
	return f.Shard.Decide(f.at(ctx), rec, commit)
}

func (f fencedShard) Finish(ctx context.Context, rec *etcdstore.CrossRecord) (*etcdstore.CrossRecord, error) {
	return f.Shard.Finish(f.at(ctx), rec)
}

func (f fencedShard) CheckParticipants(ctx context.Context, keys []authority.Key) ([]etcdstore.ParticipantCheck, error) {
	return f.Shard.CheckParticipants(f.at(ctx), keys)
}

func (f fencedShard) LockParticipants(ctx context.Context, rec *etcdstore.CrossRecord, keys []authority.Key, att etcdstore.LockAttempt) (etcdstore.LockResult, error) {
	return f.Shard.LockParticipants(f.at(ctx), rec, keys, att)
}

func (f fencedShard) ApplyParticipants(ctx context.Context, rec *etcdstore.CrossRecord, keys []authority.Key) (map[authority.Key]int64, error) {
	return f.Shard.ApplyParticipants(f.at(ctx), rec, keys)
}

func (f fencedShard) ReleaseLocks(ctx context.Context, keys []authority.Key, sel etcdstore.LockSelector) (int, error) {
	return f.Shard.ReleaseLocks(f.at(ctx), keys, sel)
}

func (f fencedShard) ReadLocked(ctx context.Context, key authority.Key) (authority.ReadResult, *etcdstore.RowLock, error) {
	return f.Shard.ReadLocked(f.at(ctx), key)
}

func (f fencedShard) ReservePart(ctx context.Context, rec *etcdstore.CrossRecord, keys []authority.Key) (etcdstore.PartKind, error) {
	return f.Shard.ReservePart(f.at(ctx), rec, keys)
}

func (f fencedShard) ReleasePart(ctx context.Context, rec *etcdstore.CrossRecord, keys []authority.Key) error {
	return f.Shard.ReleasePart(f.at(ctx), rec, keys)
}

func (f fencedShard) Withdraw(ctx context.Context, rec *etcdstore.CrossRecord) (bool, error) {
	return f.Shard.Withdraw(f.at(ctx), rec)
}
