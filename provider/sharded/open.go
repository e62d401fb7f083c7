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
	s := &Store{cfg: cfg}
	s.life, s.endLife = context.WithCancel(context.Background())
	if cfg.runsEscrow() {
		var err error
		if s.mover, err = escrow.New(escrow.Config{Shards: n, Home: s.homeShard, Chunk: cfg.EscrowChunk, Logger: cfg.Logger}); err != nil {
			return nil, err
		}
	}
	t := &topology{shards: make([]*shard, n)}
	err := s.eachShard(ctx, t, func(ctx context.Context, i int, _ *shard) error {
		sc := cfg.shardConfig(i)
		if s.mover != nil {
			sc.CapacityEscrow = s.mover.Hook(i)
		}
		sh, err := openShard(ctx, sc, i)
		t.shards[i] = sh
		if err == nil && s.mover != nil {
			err = s.mover.Attach(i, sh.store.Budget())
		}
		return err
	})
	for _, sh := range t.shards {
		if sh != nil {
			s.grow.opened = append(s.grow.opened, sh)
		}
	}
	s.grow.spares = make([]spare, len(cfg.Spares))
	if err == nil {
		s.aggs = newFenceCache(4096, recordRetention(t.shards)/2)
		err = s.checkMap(ctx, t)
	}
	if err == nil {
		err = s.load(ctx, t)
	}
	if err == nil && (n > 1 || s.mover != nil) {
		err = s.startProtocols()
	}
	if err != nil {
		s.endLife()
		_ = s.closeShards()
		return nil, err
	}
	s.watchMap()
	return s, nil
}

// homeShard is the capacity escrow's home shard of a node (its ledgers):
// escrow.HomeOf the map in force (HomeShard over its Homes(), which no
// resharding changes), so a node's ledgers stay where they are when the
// map grows.
// -1 (which the mover refuses) before New read the map; nothing asks the
// mover before.
func (s *Store) homeShard(node authority.NodeDescriptor) int {
	t := s.topo.Load()
	if t == nil {
		return -1
	}
	return escrow.HomeOf(node, t.smap)
}

// openShard opens one shard's etcd store (sc fenced on the shard map) and
// reads its cluster ID.
func openShard(ctx context.Context, sc etcdstore.Config, i int) (*shard, error) {
	st, err := etcdstore.New(ctx, sc)
	if err != nil {
		return nil, err
	}
	sh := &shard{index: i, store: st, namespace: st.Namespace()}
	if sh.clusterID, err = st.ClusterID(ctx); err != nil {
		return sh, err
	}
	return sh, nil
}

// configuredMap is the map the store's configuration names.
func (s *Store) configuredMap(t *topology) schema.ShardMap {
	m := schema.ShardMap{Epoch: s.cfg.Epoch, Hash: HashName, Shards: make([]schema.ShardMapShard, len(t.shards))}
	for i, sh := range t.shards {
		m.Shards[i] = shardID(sh)
	}
	return m
}

// checkMap compares every shard's stored map with the configured one, and
// creates it where it is missing (several shards, not read-only). A stored
// map of a later epoch that grew the configured one is accepted when the
// store has Config.Spares (load then follows it).
func (s *Store) checkMap(ctx context.Context, t *topology) error {
	want := s.configuredMap(t)
	if err := want.Check(); err != nil {
		return authority.Wrap(authority.ErrInvalidArgument, "The configured shards do not make a shard map", err)
	}
	t.smap = want
	states := make([]etcdstore.ShardMapState, len(t.shards))
	if err := s.eachShard(ctx, t, func(ctx context.Context, i int, sh *shard) (err error) {
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
		if d := st.Map.Diff(want); d != "" && !s.grownFrom(st.Map, want) {
			return mismatch(i, d)
		}
	}
	switch {
	case len(missing) == 0:
		return nil
	case len(t.shards) == 1:
		return nil // a single cluster's namespace: the one-shard map, unwritten
	case s.cfg.ReadOnly:
		return mismatch(missing[0], "no shard map stored (a read-only store does not create one)")
	}
	return s.createMap(ctx, t, want, missing)
}

// grownFrom reports whether stored is a map that grew from want by
// resharding (a later epoch whose first shards are want's), which a store
// with spares follows.
func (s *Store) grownFrom(stored, want schema.ShardMap) bool {
	if len(s.cfg.Spares) == 0 || stored.Epoch <= want.Epoch || stored.Hash != want.Hash || len(stored.Shards) <= len(want.Shards) {
		return false
	}
	for i, sh := range want.Shards {
		if stored.Shards[i] != sh {
			return false
		}
	}
	return true
}

// createMap puts want in the shards that have none, once none of them holds
// a row: rows placed without this map (a single-cluster store's) would be
// in the wrong shard. Each put is fenced on the namespace still having no
// map and no row; a map another store put meanwhile is compared instead.
func (s *Store) createMap(ctx context.Context, t *topology, want schema.ShardMap, missing []int) error {
	var mu sync.Mutex
	var found []int
	err := s.eachOf(ctx, t, missing, func(ctx context.Context, i int, sh *shard) error {
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
		if err := s.createMapIn(ctx, t, i, want); err != nil {
			return err
		}
	}
	return nil
}

// createMapIn puts want in shard i unless it holds a map already, which must
// then be want.
func (s *Store) createMapIn(ctx context.Context, t *topology, i int, want schema.ShardMap) error {
	created, st, err := t.shards[i].store.CreateShardMap(ctx, want)
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

// startProtocols starts what a store of several shards runs across them
// besides the two-phase protocol (a topology's, topology.go): the capacity
// escrow's reconciliation (at once, then every ReconcileInterval).
func (s *Store) startProtocols() error {
	if s.mover != nil && !s.background(s.reconcile) {
		return authority.ErrClosed
	}
	return nil
}

// closeShards closes every opened shard's store (a failed New, Close).
func (s *Store) closeShards() error {
	s.grow.mu.Lock()
	opened := append([]*shard(nil), s.grow.opened...)
	s.grow.mu.Unlock()
	errs := make([]error, len(opened))
	var wg sync.WaitGroup
	for i, sh := range opened {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = inShard(sh.index, sh.store.Close())
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
