package sharded

import (
	"context"

	etcdstore "github.com/zlink-systems/authority/provider/etcd"
)

// OpenSparesThenFail runs the first round of a map reload up to opening
// the spares the map keys name, and stops there as a reload does whose
// context ends at its next read (a write whose deadline ran out mid-reload):
// nothing is published. It returns how many spares it opened. first runs
// before, under the lock of reloads (so that none of the store's own
// reloads reads what it writes first).
func (s *Store) OpenSparesThenFail(ctx context.Context, first func()) (int, error) {
	s.grow.mu.Lock()
	defer s.grow.mu.Unlock()
	first()
	base := s.topo.Load()
	known := base.stores()
	keys := make([]etcdstore.MapKeys, len(known))
	for j, sh := range known {
		var err error
		if keys[j], err = sh.store.Moves().ReadMap(ctx); err != nil {
			return 0, err
		}
	}
	_, missing, err := s.build(base, known, keys)
	if err != nil {
		return 0, err
	}
	opened, err := s.openSpares(ctx, missing)
	return len(opened), err
}

// ReloadMap reads the map keys again, as a write that found its map moved
// does.
func (s *Store) ReloadMap(ctx context.Context) error { return s.refresh(ctx, s.topo.Load()) }
