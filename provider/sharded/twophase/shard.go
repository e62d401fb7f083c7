package twophase

import (
	"context"

	authority "github.com/zlink-systems/authority"
	etcd "github.com/zlink-systems/authority/provider/etcd"
)

// Router says where a sharded store keeps things: the shard of a row (every
// key the store writes for a row lives there) and the coordinator shard of
// an aggregate (where its record lives). CoordinatorOf must answer the same
// for the life of a record (a sharded store hashes over its map's home
// shards, which a resharding keeps); ShardOf may change only where no row
// lock is held (a resharding resolves every lock of a row before the row
// moves: package reshard).
type Router interface {
	// ShardOf returns the index of the shard holding the row at key.
	ShardOf(key authority.Key) int
	// CoordinatorOf returns the index of the shard holding the record of
	// the aggregate aggregateID (a hash of the ID).
	CoordinatorOf(aggregateID string) int
}

// Shard is what the protocol needs of one shard's store: the contract's
// aggregate operations (for an aggregate wholly in its coordinator shard)
// and the cross-shard side (etcd.CrossShard; each method is documented
// there). EtcdShard makes one of an etcd store.
type Shard interface {
	PrepareAggregate(ctx context.Context, req authority.AggregatePrepareRequest) (authority.PrepareAggregateResult, error)
	CommitAggregate(ctx context.Context, fence authority.Fence) (authority.CommitAggregateResult, error)
	AbortAggregate(ctx context.Context, fence authority.Fence) (authority.AbortAggregateResult, error)

	// the coordinator shard's record
	PrepareCrossShard(ctx context.Context, req authority.AggregatePrepareRequest, foreign []etcd.ParticipantCheck) (authority.PrepareAggregateResult, error)
	ReadRecord(ctx context.Context, fence authority.Fence) (*etcd.CrossRecord, error)
	TakeOver(ctx context.Context, rec *etcd.CrossRecord) (*etcd.CrossRecord, bool, error)
	Decide(ctx context.Context, rec *etcd.CrossRecord, commit bool) (*etcd.CrossRecord, bool, error)
	Finish(ctx context.Context, rec *etcd.CrossRecord) (*etcd.CrossRecord, error)

	// the participant shards' rows
	CheckParticipants(ctx context.Context, keys []authority.Key) ([]etcd.ParticipantCheck, error)
	LockParticipants(ctx context.Context, rec *etcd.CrossRecord, keys []authority.Key, att etcd.LockAttempt) (etcd.LockResult, error)
	ApplyParticipants(ctx context.Context, rec *etcd.CrossRecord, keys []authority.Key) (map[authority.Key]int64, error)
	ReleaseLocks(ctx context.Context, keys []authority.Key, sel etcd.LockSelector) (int, error)
	ReadLocked(ctx context.Context, key authority.Key) (authority.ReadResult, *etcd.RowLock, error)

	// the target's capacity a participant shard's commit moves in
	ReservePart(ctx context.Context, rec *etcd.CrossRecord, keys []authority.Key) (etcd.PartKind, error)
	ReleasePart(ctx context.Context, rec *etcd.CrossRecord, keys []authority.Key) error
	Withdraw(ctx context.Context, rec *etcd.CrossRecord) (bool, error)
}

// etcdShard is an etcd store as a Shard.
type etcdShard struct {
	*etcd.Store
	etcd.CrossShard
}

// EtcdShard returns s as a Shard.
func EtcdShard(s *etcd.Store) Shard { return etcdShard{s, s.CrossShard()} }
