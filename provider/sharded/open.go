package sharded

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	authority "github.com/zlink-systems/authority"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/sharded/escrow"
	"github.com/zlink-systems/authority/provider/sharded/twophase"
)

// New opens a store over the configured shards: one etcd store per shard,
// opened in parallel (each checks its server, its access and announces
// itself under its namespace, as etcd.New does), then checks the shard map
// in every shard. A shard that holds another map refuses the open
// (ErrShardMapMismatch naming the shard and the difference). Where no
// shard holds a map, a store of one shard opens without writing one (a
// single-cluster store's namespace is the one-shard case, and that store
// keeps working beside this one), and a store of several shards creates it
// in each, in a Txn that holds only while the namespace has no map and no
// row. Every shard's store is closed again when New fails.
func New(ctx context.Context, cfg Config) (*Store, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	n := len(cfg.Shards)
	s := &Store{cfg: cfg, shards: make([]*shard, n), num: numbering{n: n}}
	s.life, s.endLife = context.WithCancel(context.Background())
	if n > 1 && !cfg.ReadOnly && !cfg.NoCapacityPolicy {
		var err error
		if s.mover, err = escrow.New(escrow.Config{Shards: n, Chunk: cfg.EscrowChunk, Logger: cfg.Logger}); err != nil {
			return nil, err
		}
	}
	err := s.eachShard(ctx, func(ctx context.Context, i int, _ *shard) error {
		sc := cfg.shardConfig(i)
		if s.mover != nil {
			sc.CapacityEscrow = s.mover.Hook(i)
		}
		st, err := etcdstore.New(ctx, sc)
		if err != nil {
			return err
		}
		s.shards[i] = &shard{index: i, store: st, namespace: st.Namespace()}
		if s.shards[i].clusterID, err = st.ClusterID(ctx); err != nil {
			return err
		}
		if s.mover != nil {
			return s.mover.Attach(i, st.Budget())
		}
		return nil
	})
	if err == nil {
		s.aggs = newFenceCache(4096, s.recordRetention()/2)
		err = s.checkMap(ctx)
	}
	if err == nil && n > 1 {
		err = s.startProtocols()
	}
	if err != nil {
		s.endLife()
		_ = s.closeShards()
		return nil, err
	}
	return s, nil
}

// configuredMap is the map the store's configuration names.
func (s *Store) configuredMap() schema.ShardMap {
	m := schema.ShardMap{Epoch: s.cfg.Epoch, Hash: HashName, Shards: make([]schema.ShardMapShard, len(s.shards))}
	for i, sh := range s.shards {
		m.Shards[i] = schema.ShardMapShard{ClusterID: sh.clusterID, Namespace: sh.namespace}
	}
	return m
}

// checkMap compares every shard's stored map with the configured one, and
// creates it where it is missing (several shards, not read-only).
func (s *Store) checkMap(ctx context.Context) error {
	want := s.configuredMap()
	if err := want.Check(); err != nil {
		return authority.Wrap(authority.ErrInvalidArgument, "The configured shards do not make a shard map", err)
	}
	s.smap = want
	states := make([]etcdstore.ShardMapState, len(s.shards))
	if err := s.eachShard(ctx, func(ctx context.Context, i int, sh *shard) (err error) {
		states[i], err = sh.store.ReadShardMap(ctx)
		return err
	}); err != nil {
		return err
	}
	var missing []int
	for i, st := range states {
		if !st.Found {
			missing = append(missing, i)
			continue
		}
		if d := st.Map.Diff(want); d != "" {
			return mismatch(i, d)
		}
	}
	switch {
	case len(missing) == 0:
		return nil
	case len(s.shards) == 1:
		return nil // a single cluster's namespace: the one-shard map, unwritten
	case s.cfg.ReadOnly:
		return mismatch(missing[0], "no shard map stored (a read-only store does not create one)")
	}
	return s.createMap(ctx, want, missing)
}

// createMap puts want in the shards that have none, once none of them holds
// a row: rows placed without this map (a single-cluster store's) would be
// in the wrong shard. Each put is fenced on the namespace still having no
// map and no row; a map another store put meanwhile is compared instead.
func (s *Store) createMap(ctx context.Context, want schema.ShardMap, missing []int) error {
	var mu sync.Mutex
	var found []int
	err := s.eachOf(ctx, missing, func(ctx context.Context, i int, sh *shard) error {
		page, _, err := sh.store.ListPageAt(ctx, "", "", 0, 1)
		if err == nil && len(page.Items) > 0 {
			mu.Lock()
			found = append(found, i)
			mu.Unlock()
		}
		return err
	})
	if err != nil {
		return err
	}
	if len(found) > 0 {
		return mismatch(slices.Min(found), "its namespace holds rows but no shard map (a single-cluster store's namespace opens only as the one shard of a one-shard store)")
	}
	// one shard after another, lowest first: stores racing to create
	// different maps all try the lowest missing shard first, where one
	// wins and the others stop at its map, so no two shards end with
	// different maps (in parallel, each racer could win a shard of its own
	// and leave a namespace no configuration opens)
	for _, i := range missing {
		if err := s.createMapIn(ctx, i, want); err != nil {
			return err
		}
	}
	return nil
}

// createMapIn puts want in shard i unless it holds a map already, which must
// then be want.
func (s *Store) createMapIn(ctx context.Context, i int, want schema.ShardMap) error {
	created, st, err := s.shards[i].store.CreateShardMap(ctx, want)
	switch {
	case err != nil || created:
		return err
	case st.Found:
		if d := st.Map.Diff(want); d != "" {
			return mismatch(i, d)
		}
		return nil
	}
	return mismatch(i, "rows appeared in its namespace while the shard map was being created")
}

func mismatch(shard int, diff string) error {
	return fmt.Errorf("%w: shard %d: %s", ErrShardMapMismatch, shard, diff)
}

// startProtocols starts what a store of several shards runs across them:
// the two-phase protocol's coordinator, and the capacity escrow's
// reconciliation (at once, then every ReconcileInterval).
func (s *Store) startProtocols() error {
	shards := make([]twophase.Shard, len(s.shards))
	for i, sh := range s.shards {
		shards[i] = twophase.EtcdShard(sh.store)
	}
	var err error
	if s.coord, err = twophase.New(shards, router{s}); err != nil {
		return err
	}
	if s.mover != nil && !s.background(s.reconcile) {
		return authority.ErrClosed
	}
	return nil
}

// router places rows and aggregate records for the two-phase protocol.
type router struct{ s *Store }

func (r router) ShardOf(key authority.Key) int        { return r.s.ShardOf(key) }
func (r router) CoordinatorOf(aggregateID string) int { return r.s.CoordinatorOf(aggregateID) }

// closeShards closes every opened shard's store (a failed New, Close).
func (s *Store) closeShards() error {
	errs := make([]error, len(s.shards))
	var wg sync.WaitGroup
	for i, sh := range s.shards {
		if sh == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = inShard(i, sh.store.Close())
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
