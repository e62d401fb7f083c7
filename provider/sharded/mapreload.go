package sharded

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	authority "github.com/zlink-systems/authority"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
)

// Reading the map in force (topology.go): every shard's map keys, the
// highest epoch's map among them, a move pending or frozen, and the
// clusters of Config.Spares the map or the move names.

// mapRefresh is how often the store reads the map keys even when its watch
// of them reported nothing.
const mapRefresh = 30 * time.Second

// load reads the map keys of base's shards and publishes the topology they
// make (New).
func (s *Store) load(ctx context.Context, base *topology) error {
	s.grow.mu.Lock()
	defer s.grow.mu.Unlock()
	return s.reloadFrom(ctx, base)
}

// refresh reloads the map after an operation routed by seen found it moved,
// unless another reload replaced seen meanwhile.
func (s *Store) refresh(ctx context.Context, seen *topology) error {
	s.grow.mu.Lock()
	defer s.grow.mu.Unlock()
	if s.topo.Load() != seen {
		return nil
	}
	return s.reloadFrom(ctx, seen)
}

// reloadFrom reads the map keys of every store base writes to (opening the
// spares the map names, then reading those too) and publishes the topology
// they make. Under grow.mu.
func (s *Store) reloadFrom(ctx context.Context, base *topology) error {
	known := base.stores()
	for range 4 {
		keys := make([]etcdstore.MapKeys, len(known))
		errs := make([]error, len(known))
		var wg sync.WaitGroup
		for j, sh := range known {
			wg.Add(1)
			go func() {
				defer wg.Done()
				keys[j], errs[j] = sh.store.Moves().ReadMap(ctx)
				errs[j] = inShard(sh.index, errs[j])
			}()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				return err
			}
		}
		next, missing, err := s.build(base, known, keys)
		if err != nil {
			return err
		}
		if len(missing) == 0 {
			return s.publishGrown(next, base)
		}
		opened, err := s.openSpares(ctx, missing)
		if err != nil {
			return err
		}
		known = append(known, opened...)
	}
	return authority.Wrap(authority.ErrUnavailable, "The shard map kept naming clusters the store did not know while it read them.", nil)
}

// build makes the topology the map keys of known (read in keys) say: the
// map in force is the one of the highest epoch stored (base's when none is
// stored: one shard over a single cluster's namespace). missing names the
// clusters it needs that known lacks, with the index each has in its map.
func (s *Store) build(base *topology, known []*shard, keys []etcdstore.MapKeys) (*topology, map[schema.ShardMapShard]int, error) {
	inForce := base.smap
	for _, k := range keys {
		// the stored map of the configured epoch too: it carries the home
		// shards (HomeShards) a configuration does not name
		if k.Current != nil && (k.Current.Epoch > inForce.Epoch || k.Current.Epoch == inForce.Epoch && inForce.HomeShards == 0) {
			inForce = *k.Current
		}
	}
	if inForce.Epoch > base.smap.Epoch && !extends(inForce, base.smap) {
		return nil, nil, fmt.Errorf("%w: the stored map of epoch %d does not grow the store's map of epoch %d", ErrShardMapMismatch, inForce.Epoch, base.smap.Epoch)
	}
	find := func(id schema.ShardMapShard) int {
		return slices.IndexFunc(known, func(sh *shard) bool { return shardID(sh) == id })
	}
	n := len(inForce.Shards)
	t := &topology{smap: inForce, shards: make([]*shard, n), fence: make([]int64, n), frozen: make([]bool, n)}
	missing := map[schema.ShardMapShard]int{}
	for i, id := range inForce.Shards {
		j := find(id)
		if j < 0 {
			missing[id] = i
			continue
		}
		t.shards[i], t.fence[i], t.frozen[i] = known[j], keys[j].CurrentRev, keys[j].Switching != nil
	}
	for _, k := range keys {
		mv := k.Switching
		if mv == nil {
			mv = k.Pending
		}
		if mv != nil && (mv.From.Epoch == inForce.Epoch || mv.To.Epoch == inForce.Epoch) && (t.move == nil || k.Switching != nil) {
			t.move = mv
		}
	}
	if t.move != nil && t.move.From.Epoch == inForce.Epoch {
		id := t.move.To.Shards[len(t.move.To.Shards)-1]
		if j := find(id); j >= 0 {
			t.target, t.targetFence = known[j], keys[j].CurrentRev
		} else {
			missing[id] = len(t.move.To.Shards) - 1
		}
	}
	return t, missing, nil
}

// extends reports whether grown is a later map with m's shards first.
func extends(grown, m schema.ShardMap) bool {
	if grown.Hash != m.Hash || len(grown.Shards) < len(m.Shards) {
		return false
	}
	for i, sh := range m.Shards {
		if grown.Shards[i] != sh {
			return false
		}
	}
	return true
}

// publishGrown publishes next, and takes the store's owner leases in every
// store next writes to that base did not. A store running capacity escrow
// first adds the shards next has beyond its mover's to the mover (their
// stores were opened with its hooks, openSpares), so that escrow covers
// every shard operations are routed to: so does a store opened over one
// shard with Spares, whose mover had that one shard (Config.runsEscrow). A
// store with a policy and no escrow refuses the grown map
// (ErrCapacityNeedsEscrow).
func (s *Store) publishGrown(next, base *topology) error {
	if p := s.policy(); p != nil && s.mover == nil && len(next.shards) > 1 && len(base.shards) == 1 {
		return authority.Wrap(authority.ErrUnavailable, fmt.Sprintf(
			"The shard map grew to %d shards (epoch %d): a capacity policy over several shards needs capacity escrow, which a store opened over one shard without Spares does not run; reopen the store with the new map or with Spares, or without the policy.",
			len(next.shards), next.smap.Epoch), ErrCapacityNeedsEscrow)
	}
	if s.mover != nil {
		for i := s.mover.Shards(); i < len(next.shards); i++ {
			if err := s.mover.AddShard(i, next.shards[i].store.Budget()); err != nil {
				return inShard(i, err)
			}
		}
	}
	var added []*shard
	for _, sh := range next.stores() {
		if !slices.Contains(base.stores(), sh) {
			added = append(added, sh)
		}
	}
	// the policy in force, nil included: a spare was opened with the
	// configured one, which SetCapacityPolicy may have replaced or removed
	// (applyPolicy sets it under the same lock)
	for _, sh := range added {
		sh.store.SetCapacityPolicy(s.policy())
	}
	s.publish(next)
	if len(added) > 0 {
		s.background(func() { s.owners.extend(s, added) })
	}
	return nil
}

// openSpares opens the clusters of Config.Spares that missing names (each
// at the index its map gives it), asking each spare not asked yet which
// cluster and namespace it is (one it cannot reach is asked again at the
// next reload, and named in the error when missing stays unresolved); a
// spare opened before (by a reload that failed afterwards) is returned as
// it is. A cluster no spare is refuses the reload
// with ErrUnavailable naming it.
func (s *Store) openSpares(ctx context.Context, missing map[schema.ShardMapShard]int) ([]*shard, error) {
	var opened []*shard
	var unprobed []error // spares not reached: one may be what missing names
	for j := range s.grow.spares {
		if len(missing) == 0 {
			break
		}
		sp := &s.grow.spares[j]
		if !sp.probed {
			id, err := probe(ctx, s.cfg.Spares[j])
			if err != nil {
				// a spare for a later growth may be down or not there yet:
				// the others may be the clusters missing names
				unprobed = append(unprobed, fmt.Errorf("spare %d: %w", j, err))
				continue
			}
			sp.id, sp.probed = id, true
		}
		i, wanted := missing[sp.id]
		if !wanted {
			continue
		}
		if sp.opened != nil && sp.opened.index == i {
			// opened by a reload that failed after it (its context ended
			// at its next read): not among base's stores, still open
			opened = append(opened, sp.opened)
			delete(missing, sp.id)
			continue
		}
		// not opened yet, or opened at another index (the new cluster of
		// a move that was aborted, now added at another place): its
		// escrow hook is its index's, so open it again at this one (the
		// other stays open until Close: an operation may still hold it)
		sc := s.cfg.storeConfig(s.cfg.Spares[j], i)
		if s.mover != nil {
			sc.CapacityEscrow = s.mover.Hook(i) // added to the mover when the map names it (publishGrown)
		}
		sh, err := openShard(ctx, sc, i)
		if err != nil {
			if sh != nil {
				_ = sh.store.Close()
			}
			return nil, fmt.Errorf("spare %d: %w", j, err)
		}
		sp.opened = sh
		s.grow.opened = append(s.grow.opened, sh)
		opened = append(opened, sh)
		delete(missing, sp.id)
	}
	for id, i := range missing {
		if !slices.ContainsFunc(opened, func(sh *shard) bool { return shardID(sh) == id }) {
			return nil, authority.Wrap(authority.ErrUnavailable, fmt.Sprintf(
				"The shard map names cluster %s namespace %q as shard %d, which is neither among the store's shards nor among the Config.Spares it reached (%d not reached).",
				id.ClusterID, id.Namespace, i, len(unprobed)), errors.Join(unprobed...))
		}
	}
	return opened, nil
}

// probe returns the cluster and namespace of a spare, through a read-only
// store that writes nothing.
func probe(ctx context.Context, sc etcdstore.Config) (schema.ShardMapShard, error) {
	sc.ReadOnly = true
	st, err := etcdstore.New(ctx, sc)
	if err != nil {
		return schema.ShardMapShard{}, err
	}
	defer func() { _ = st.Close() }()
	id, err := st.ClusterID(ctx)
	return schema.ShardMapShard{ClusterID: id, Namespace: st.Namespace()}, err
}

// watchMap follows shard 0's map keys (a resharding writes every shard's,
// shard 0's among them) and reloads the map when they change, and every
// mapRefresh, until Close.
// The first watch is opened before it returns (New's caller sees its
// stream open).
func (s *Store) watchMap() {
	ctx, cancel := context.WithCancel(context.Background())
	s.grow.stopWatch = cancel
	changed, stop := s.topo.Load().shards[0].store.Moves().WatchMap(ctx)
	if !s.background(func() { s.followMap(ctx, changed, stop) }) {
		stop()
		cancel()
	}
}

func (s *Store) followMap(ctx context.Context, changed <-chan struct{}, stop func()) {
	tick := time.NewTicker(mapRefresh)
	defer tick.Stop()
	for ctx.Err() == nil {
		s.followMapOnce(ctx, tick.C, changed, stop)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
		changed, stop = s.topo.Load().shards[0].store.Moves().WatchMap(ctx)
	}
	stop()
}

// followMapOnce reloads the map at each change its watch of shard 0 reports
// and at each tick, until the watch ends.
func (s *Store) followMapOnce(ctx context.Context, tick <-chan time.Time, changed <-chan struct{}, stop func()) {
	defer stop()
	for open := true; open; {
		select {
		case <-ctx.Done():
			return
		case _, open = <-changed:
		case <-tick:
		}
		if err := s.refresh(ctx, s.topo.Load()); err != nil && ctx.Err() == nil && s.cfg.Logger != nil {
			s.cfg.Logger.Warn("reading the shard map", "err", err)
		}
	}
}
