package sharded

import (
	"context"
	"sync/atomic"
	"time"

	authority "github.com/zlink-systems/authority"
)

// Capacity. A node's rows live in every shard, and so do their capacity
// entries: each in its row's shard, as on one cluster. CapacityUsage sums
// the shards. A capacity policy is checked by each shard's store against
// that shard's entries only, so over several shards it needs capacity
// escrow (Config.Escrow), which gives each shard a slice of every node's
// budget; without it the store refuses a policy over several shards
// (ErrCapacityNeedsEscrow) rather than over-admit a node.

// CapacityUsage returns the active and reserved counts of one counter of a
// node lifecycle: the sum of every shard's, read in parallel (each shard's
// count is exact at its read; the sum is not one instant's).
func (s *Store) CapacityUsage(ctx context.Context, node authority.NodeDescriptor, lifecycle int64, kind authority.ObjectKind, stableType string) (authority.CapacityUsage, error) {
	if err := s.begin(ctx); err != nil {
		return authority.CapacityUsage{}, err
	}
	if len(s.shards) == 1 {
		u, err := s.shards[0].store.CapacityUsage(ctx, node, lifecycle, kind, stableType)
		return u, inShard(0, err)
	}
	var active, reserved atomic.Int64
	err := s.eachShard(ctx, func(ctx context.Context, _ int, sh *shard) error {
		u, err := sh.store.CapacityUsage(ctx, node, lifecycle, kind, stableType)
		active.Add(u.Active)
		reserved.Add(u.Reserved)
		return err
	})
	if err != nil {
		return authority.CapacityUsage{}, err
	}
	return authority.CapacityUsage{Active: active.Load(), Reserved: reserved.Load()}, nil
}

// SetCapacityPolicy replaces the placement capacity policy (nil: every
// placement fits). Over several shards without escrow a policy is refused
// (ErrCapacityNeedsEscrow) and the policy in force stays.
func (s *Store) SetCapacityPolicy(p authority.CapacityPolicy) error {
	if len(s.shards) > 1 && p != nil && s.cfg.Escrow == nil {
		return capacityNeedsEscrow(len(s.shards))
	}
	for i, sh := range s.shards {
		if s.cfg.Escrow != nil {
			sh.store.SetCapacityPolicy(s.cfg.Escrow.ShardPolicy(i, p))
		} else {
			sh.store.SetCapacityPolicy(p)
		}
	}
	return nil
}

// PruneCapacityEpochs deletes, in every shard, the capacity epochs of node
// lifecycles that hold no capacity there, and returns how many. A shard
// that fails leaves the others pruned; call it again.
func (s *Store) PruneCapacityEpochs(ctx context.Context) (int, error) {
	var n atomic.Int64
	err := s.run(ctx, s.all(), false, func(ctx context.Context, _ int, sh *shard) error {
		k, err := sh.store.PruneCapacityEpochs(ctx)
		n.Add(int64(k))
		return err
	})
	return int(n.Load()), err
}

// RecordRetention is how long the shards keep reservation terminals and
// finished aggregate records (the shortest of theirs).
func (s *Store) RecordRetention() time.Duration { return s.recordRetention() }

func (s *Store) recordRetention() time.Duration {
	r := s.shards[0].store.RecordRetention()
	for _, sh := range s.shards[1:] {
		r = min(r, sh.store.RecordRetention())
	}
	return r
}
