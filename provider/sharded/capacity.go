package sharded

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/provider/sharded/escrow"
)

// Capacity. A node's rows live in every shard, and so do their capacity
// entries: each in its row's shard, as on one cluster. CapacityUsage sums
// the shards. Over several shards the capacity policy holds across them by
// capacity escrow (package escrow): every shard's store runs in escrow mode,
// admitting a placement only within its own slice of the node's budget
// (fenced in its Txn), and the store's mover moves budget between shards in
// fenced steps when a slice runs short, asking the policy only for budget
// granted on top of what every shard holds.

// CapacityUsage returns the active and reserved counts of one counter of a
// node lifecycle: the sum of every shard's, read in parallel (each shard's
// count is exact at its read; the sum is not one instant's).
func (s *Store) CapacityUsage(ctx context.Context, node authority.NodeDescriptor, lifecycle int64, kind authority.ObjectKind, stableType string) (authority.CapacityUsage, error) {
	if err := s.begin(ctx); err != nil {
		return authority.CapacityUsage{}, err
	}
	t := s.topo.Load()
	if len(t.shards) == 1 {
		u, err := t.shards[0].store.CapacityUsage(ctx, node, lifecycle, kind, stableType)
		return u, inShard(0, err)
	}
	var active, reserved atomic.Int64
	err := s.eachShard(ctx, t, func(ctx context.Context, _ int, sh *shard) error {
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
// placement fits) in every shard, and in the clusters a resharding adds
// later. A store that runs no capacity escrow (opened over one shard
// without Spares) whose map grew to several refuses a policy
// (ErrCapacityNeedsEscrow, also
// ErrInvalidArgument; nothing changes). Over several shards it then takes back
// every shard's unused budget (escrow.Mover.ReconcileAll with reclaim), so
// that a lowered limit governs the next placements at once: until that
// finishes, budget granted under the previous policy stays usable. An error
// is the reclaim's: the policy is in force; call again to reclaim.
func (s *Store) SetCapacityPolicy(ctx context.Context, p authority.CapacityPolicy) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	if p != nil && s.cfg.NoCapacityPolicy {
		return authority.Invalid("This store was opened with NoCapacityPolicy: it runs no capacity escrow, so it takes no capacity policy; open one without NoCapacityPolicy.")
	}
	if err := s.applyPolicy(p); err != nil {
		return err
	}
	if s.mover == nil {
		return nil
	}
	_, err := s.mover.ReconcileAll(ctx, true)
	return err
}

// applyPolicy makes p the store's policy and gives it to every store the
// topology writes to, under the lock of map reloads: a reload publishing a
// grown map (publishGrown) gives its added stores the policy it reads
// under that lock, so none keeps a policy replaced meanwhile. A store
// opened over one shard without Spares runs no escrow: it takes a policy
// only while its map has one shard (publishGrown refuses to grow under a
// policy, checked under the same lock).
func (s *Store) applyPolicy(p authority.CapacityPolicy) error {
	s.grow.mu.Lock()
	defer s.grow.mu.Unlock()
	if t := s.topo.Load(); s.mover == nil && !s.cfg.ReadOnly && p != nil && len(t.shards) > 1 {
		return authority.Wrap(authority.ErrInvalidArgument, fmt.Sprintf(
			"The shard map grew to %d shards (epoch %d) under a store opened over one shard without Spares, which runs no capacity escrow: a capacity policy over several shards needs it; reopen the store over the grown map.",
			len(t.shards), t.smap.Epoch), ErrCapacityNeedsEscrow)
	}
	s.pol.Store(&policyBox{p})
	for _, sh := range s.topo.Load().stores() {
		sh.store.SetCapacityPolicy(p)
	}
	return nil
}

// reconcile finishes the budget transfers a mover left in flight (a process
// stopped between the two steps of one), now and every ReconcileInterval,
// until the store closes.
func (s *Store) reconcile() {
	for {
		if _, err := s.mover.ReconcileAll(s.life, false); err != nil && s.life.Err() == nil && s.cfg.Logger != nil {
			s.cfg.Logger.Warn("capacity escrow: reconciling the shards' budgets failed", "error", err)
		}
		if s.cfg.ReconcileInterval < 0 {
			return
		}
		t := time.NewTimer(s.cfg.ReconcileInterval)
		select {
		case <-s.life.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// EscrowStats counts the capacity escrow's work (escrow.Stats).
type EscrowStats = escrow.Stats

// EscrowStats returns the capacity escrow's counts since New (zero over one
// shard or for a read-only store).
func (s *Store) EscrowStats() EscrowStats {
	if s.mover == nil {
		return EscrowStats{}
	}
	return s.mover.Stats()
}

// ReconcileEscrow finishes every budget transfer left in flight across the
// shards, and with reclaim also takes back every shard's unused budget
// (escrow.Mover.ReconcileAll); it returns how many node lifecycles it
// visited. The store runs it every Config.ReconcileInterval.
func (s *Store) ReconcileEscrow(ctx context.Context, reclaim bool) (int, error) {
	if err := s.begin(ctx); err != nil {
		return 0, err
	}
	if s.mover == nil {
		return 0, nil
	}
	return s.mover.ReconcileAll(ctx, reclaim)
}

// policyBox holds the policy SetCapacityPolicy set last.
type policyBox struct{ p authority.CapacityPolicy }

// policy returns the policy SetCapacityPolicy set last (nil: the
// configured one, which New gave the shards).
func (s *Store) policy() authority.CapacityPolicy {
	if b := s.pol.Load(); b != nil {
		return b.p
	}
	return s.cfg.CapacityPolicy
}

// PruneCapacityEpochs deletes, in every shard, the capacity epochs of node
// lifecycles that hold no capacity there, and returns how many. A shard
// that fails leaves the others pruned; call it again.
func (s *Store) PruneCapacityEpochs(ctx context.Context) (int, error) {
	var n atomic.Int64
	t := s.topo.Load()
	err := s.run(ctx, t, t.all(), false, func(ctx context.Context, _ int, sh *shard) error {
		k, err := sh.store.PruneCapacityEpochs(ctx)
		n.Add(int64(k))
		return err
	})
	return int(n.Load()), err
}

// RecordRetention is how long the shards keep reservation terminals and
// finished aggregate records (the shortest of theirs).
func (s *Store) RecordRetention() time.Duration { return recordRetention(s.topo.Load().shards) }

func recordRetention(shards []*shard) time.Duration {
	r := shards[0].store.RecordRetention()
	for _, sh := range shards[1:] {
		r = min(r, sh.store.RecordRetention())
	}
	return r
}
