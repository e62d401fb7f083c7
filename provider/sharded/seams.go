package sharded

import (
	"context"

	authority "github.com/zlink-systems/authority"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
)

// The two seams where the parts that make capacity and aggregates exact
// across shards plug in. Without them a sharded store keeps every guarantee
// by refusing what it cannot do exactly: a capacity policy over several
// shards (ErrCapacityNeedsEscrow) and an aggregate whose participants span
// shards (ErrCrossShardAggregate).

// CapacityEscrow makes a capacity policy exact across shards (package
// provider/sharded/escrow): each shard admits placements against its own
// slice of every node's budget, fenced in the shard's reservation Txn, and
// moves budget between shards in fenced steps. With it, New and
// SetCapacityPolicy accept a policy over several shards.
type CapacityEscrow interface {
	// ConfigureShard edits shard i's etcd configuration before New opens
	// it (cfg.CapacityPolicy is then the policy the store was given): it
	// installs what the shard's store needs (its provider/etcd option, a
	// per-shard policy).
	ConfigureShard(i int, cfg *etcdstore.Config) error
	// Bind is called once, when New has opened every shard and checked
	// the shard map, with the shards' stores in map order.
	Bind(ctx context.Context, shards []*etcdstore.Store) error
	// ShardPolicy returns the policy shard i applies when the store's
	// policy becomes p (SetCapacityPolicy; nil: every placement fits).
	ShardPolicy(i int, p authority.CapacityPolicy) authority.CapacityPolicy
	// Close releases what Bind started; the store calls it before it
	// closes the shards.
	Close() error
}

// CrossShardAggregates commits an aggregate whose participants live in
// several shards, all or nothing (package provider/sharded/twophase: one
// decision record, every participant row fenced while prepared). The store
// keeps aggregates of one shard on that shard's store and hands it the rest.
type CrossShardAggregates interface {
	// Bind is called once, when New has opened every shard and checked the
	// shard map, with the shards' stores in map order and the function
	// placing a key.
	Bind(ctx context.Context, shards []*etcdstore.Store, shardOf func(authority.Key) int) error
	// Prepare prepares req, already validated, whose participants live in
	// the shards named (ascending, two or more).
	Prepare(ctx context.Context, req authority.AggregatePrepareRequest, shards []int) (authority.PrepareAggregateResult, error)
	// Commit and Abort finish an aggregate Owns reports.
	Commit(ctx context.Context, fence authority.Fence) (authority.CommitAggregateResult, error)
	Abort(ctx context.Context, fence authority.Fence) (authority.AbortAggregateResult, error)
	// Owns reports whether fence names an aggregate it recorded (found in
	// no shard's store: the store asks it before answering from the
	// fence's home shard).
	Owns(ctx context.Context, fence authority.Fence) (bool, error)
	// Close releases what Bind started; the store calls it before it
	// closes the shards.
	Close() error
}
