package sharded

import (
	"context"
	"sync/atomic"

	authority "github.com/zlink-systems/authority"
)

// RemoveAllByOwner deletes every row held by owner in every shard, the
// shards in parallel (each shard's rows fenced by their versions, as on one
// cluster; a row locked by a cross-shard aggregate's commit is resolved
// first, twophase.Coordinator.Retry), and returns how many it removed. A shard that fails leaves the
// others' rows removed and the error names it; the count includes what was
// removed. Calling it again removes the rest (it is idempotent).
func (s *Store) RemoveAllByOwner(ctx context.Context, owner authority.OwnerToken) (int64, error) {
	if err := authority.ValidateOwner(owner); err != nil {
		return 0, err
	}
	if err := s.begin(ctx); err != nil {
		return 0, err
	}
	var n atomic.Int64
	err := s.rerouted(ctx, func(t *topology) error {
		if err := t.refuseFrozen("Removing an owner's rows"); err != nil {
			return err
		}
		return s.run(ctx, t, t.all(), false, func(ctx context.Context, i int, sh *shard) error {
			return t.retry(t.at(ctx, i), func(ctx context.Context) error {
				k, err := sh.store.RemoveAllByOwner(ctx, owner)
				n.Add(k)
				return err
			})
		})
	})
	return n.Load(), err
}
