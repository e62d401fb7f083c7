package sharded

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	authority "github.com/zlink-systems/authority"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/sharded/escrow"
)

// Store is the authority store over several etcd clusters: one etcd store
// per shard, each row in the shard its key hashes to. It implements
// authority.Store, authority.ChangeWaiter, authority.RowFeed and
// authority.FeedPositioner. It is safe for concurrent use.
type Store struct {
	cfg Config
	// topo is the shard map in force as the store last read it, its shards,
	// and a resharding in progress (topology.go); replaced, never changed.
	topo atomic.Pointer[topology]
	// grow holds what the store opened beyond its configured shards, and
	// serializes reloads of the map (topology.go).
	grow growth
	// aggs remembers the shard each aggregate was prepared in.
	aggs *fenceCache
	// mover moves capacity budget between the shards (nil over one shard,
	// and for a read-only store); a shard a resharding adds is added to it
	// when the store follows the grown map (publishGrown).
	mover  *escrow.Mover
	closed atomic.Bool
	// owners are the store's live owner leases, which a shard added by a
	// resharding must also hold (owners.go).
	owners ownerSet
	// pol is the capacity policy SetCapacityPolicy set last, which a shard
	// added by a resharding gets too.
	pol atomic.Pointer[policyBox]
	// life ends when the store closes: feeds a caller did not close end
	// with it.
	life    context.Context
	endLife context.CancelFunc

	// bg counts the goroutines the store's owner leases run; Close waits
	// for them once the shards are closed (which ends every shard lease).
	bg       sync.WaitGroup
	bgMu     sync.Mutex
	bgClosed bool
}

// shard is one shard of the map: its etcd store and its place in the map.
type shard struct {
	index     int
	store     *etcdstore.Store
	clusterID string
	namespace string
}

var (
	_ authority.Store          = (*Store)(nil)
	_ authority.ChangeWaiter   = (*Store)(nil)
	_ authority.RowFeed        = (*Store)(nil)
	_ authority.FeedPositioner = (*Store)(nil)
)

// Shards returns how many shards the map in force has.
func (s *Store) Shards() int { return len(s.topo.Load().shards) }

// Shard returns shard i's etcd store (0 ≤ i < Shards()), for what is per
// cluster (its upgrade status, server warning, write statistics). Writing
// rows through it directly bypasses the shard map (a key must only be
// written in its own shard, ShardOf) and the row locks' resolution, and
// over several shards its row versions and tokens are the cluster's
// revisions, not this store's (rowversion.go).
func (s *Store) Shard(i int) *etcdstore.Store { return s.topo.Load().shards[i].store }

// ShardOf returns the shard key's row lives in under the map in force.
func (s *Store) ShardOf(key authority.Key) int { return s.topo.Load().shardOf(key) }

// Map returns the shard map in force, as the store last read it.
func (s *Store) Map() schema.ShardMap {
	m := s.topo.Load().smap
	m.Shards = append([]schema.ShardMapShard(nil), m.Shards...)
	return m
}

// Close closes every shard's store (each revokes its owner leases and its
// announcement, as etcd.Store.Close does) and stops the capacity escrow's
// reconciliation. Rows and records stay.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	s.bgMu.Lock()
	s.bgClosed = true
	s.bgMu.Unlock()
	s.grow.stop()
	s.endLife()
	err := s.closeShards()
	s.bg.Wait()
	return err
}

// background runs f on a goroutine Close waits for; false (f not run) once
// the store is closing.
func (s *Store) background(f func()) bool {
	s.bgMu.Lock()
	defer s.bgMu.Unlock()
	if s.bgClosed {
		return false
	}
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		f()
	}()
	return true
}

// begin refuses work on a closed store.
func (s *Store) begin(ctx context.Context) error {
	if s.closed.Load() {
		return authority.ErrClosed
	}
	return ctx.Err()
}

// eachShard runs fn on every shard of t in parallel and returns the error
// of the lowest shard that failed (naming it); fn's context ends once one
// failed.
func (s *Store) eachShard(ctx context.Context, t *topology, fn func(ctx context.Context, i int, sh *shard) error) error {
	return s.run(ctx, t, t.all(), true, fn)
}

// eachOf is eachShard over the shards named.
func (s *Store) eachOf(ctx context.Context, t *topology, which []int, fn func(ctx context.Context, i int, sh *shard) error) error {
	return s.run(ctx, t, which, true, fn)
}

// all names every shard of t.
func (t *topology) all() []int {
	all := make([]int, len(t.shards))
	for i := range all {
		all[i] = i
	}
	return all
}

// run runs fn on the shards named, in parallel. With stop, fn's context
// ends once one failed, and the error returned is the lowest shard's that
// is not that cancellation; without it every shard runs to its end and the
// lowest shard's error is returned. Each error names its shard.
func (s *Store) run(ctx context.Context, t *topology, which []int, stop bool, fn func(ctx context.Context, i int, sh *shard) error) error {
	if len(which) == 1 {
		return inShard(which[0], fn(ctx, which[0], t.shards[which[0]]))
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make([]error, len(t.shards))
	var wg sync.WaitGroup
	for _, i := range which {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if errs[i] = fn(rctx, i, t.shards[i]); errs[i] != nil && stop {
				cancel()
			}
		}()
	}
	wg.Wait()
	var first error
	for _, i := range which {
		if errs[i] == nil {
			continue
		}
		err := inShard(i, errs[i])
		if first == nil {
			first = err
		}
		if ctx.Err() != nil || !errors.Is(err, context.Canceled) {
			return err
		}
	}
	return first
}
