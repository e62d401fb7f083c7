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
	"github.com/zlink-systems/authority/provider/sharded/twophase"
)

// Store is the authority store over several etcd clusters: one etcd store
// per shard, each row in the shard its key hashes to. It implements
// authority.Store, authority.ChangeWaiter, authority.RowFeed and
// authority.FeedPositioner. It is safe for concurrent use.
type Store struct {
	cfg    Config
	shards []*shard
	// smap is the shard map every shard holds (or, for one shard over a
	// single cluster's namespace, would hold).
	smap schema.ShardMap
	// aggs remembers the shard each aggregate was prepared in.
	aggs *fenceCache
	// num translates row numbers between the shards' stores and this one.
	num numbering
	// coord runs the two-phase protocol of aggregates across shards, and
	// resolves the row locks it leaves (nil over one shard).
	coord *twophase.Coordinator
	// mover moves capacity budget between the shards (nil over one shard,
	// and for a read-only store).
	mover  *escrow.Mover
	closed atomic.Bool
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

// Shards returns how many shards the store has.
func (s *Store) Shards() int { return len(s.shards) }

// Shard returns shard i's etcd store (0 ≤ i < Shards()), for what is per
// cluster (its upgrade status, server warning, write statistics). Writing
// rows through it directly bypasses the shard map (a key must only be
// written in its own shard, ShardOf) and the row locks' resolution, and
// over several shards its row versions and tokens are the cluster's
// revisions, not this store's (rowversion.go).
func (s *Store) Shard(i int) *etcdstore.Store { return s.shards[i].store }

// ShardOf returns the shard key's row lives in.
func (s *Store) ShardOf(key authority.Key) int { return shardOf(string(key), len(s.shards)) }

// Map returns the shard map the store checked at New.
func (s *Store) Map() schema.ShardMap {
	m := s.smap
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

// forKey returns the shard of key.
func (s *Store) forKey(key authority.Key) *shard { return s.shards[s.ShardOf(key)] }

// forObject returns the shard of an object key; a key that does not encode
// goes to shard 0, whose store refuses it as any store does.
func (s *Store) forObject(k authority.ObjectKey) *shard {
	key, err := k.Encode()
	if err != nil {
		return s.shards[0]
	}
	return s.forKey(key)
}

// eachShard runs fn on every shard in parallel and returns the error of
// the lowest shard that failed (naming it); fn's context ends once one
// failed.
func (s *Store) eachShard(ctx context.Context, fn func(ctx context.Context, i int, sh *shard) error) error {
	return s.run(ctx, s.all(), true, fn)
}

// eachOf is eachShard over the shards named.
func (s *Store) eachOf(ctx context.Context, which []int, fn func(ctx context.Context, i int, sh *shard) error) error {
	return s.run(ctx, which, true, fn)
}

// all names every shard.
func (s *Store) all() []int {
	all := make([]int, len(s.shards))
	for i := range all {
		all[i] = i
	}
	return all
}

// run runs fn on the shards named, in parallel. With stop, fn's context
// ends once one failed, and the error returned is the lowest shard's that
// is not that cancellation; without it every shard runs to its end and the
// lowest shard's error is returned. Each error names its shard.
func (s *Store) run(ctx context.Context, which []int, stop bool, fn func(ctx context.Context, i int, sh *shard) error) error {
	if len(which) == 1 {
		return inShard(which[0], fn(ctx, which[0], s.shards[which[0]]))
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make([]error, len(s.shards))
	var wg sync.WaitGroup
	for _, i := range which {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if errs[i] = fn(rctx, i, s.shards[i]); errs[i] != nil && stop {
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
