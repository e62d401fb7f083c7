package escrow

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/provider/etcd/schema"
)

// nodeKey names a node lifecycle for the per-node lock.
func nodeKey(node authority.NodeDescriptor, lifecycle int64) string {
	return node.MeshName + "\x00" + node.RID + "\x00" + strconv.FormatInt(lifecycle, 10)
}

// reclaim finishes every transfer of the node lifecycle in flight and gives
// every shard's slack back to the ledger in shard h: after it, each
// shard's line in the ledger is its slice, and each slice is its usage
// (but for what concurrent grows moved since). One reclaim at a time per
// node lifecycle in this mover; a caller that finds one running waits, and
// when a reclaim that started after it arrived has succeeded meanwhile, it
// takes that one's result instead of running its own (reclaimQueue).
func (m *Mover) reclaim(ctx context.Context, shards []Shard, h int, node authority.NodeDescriptor, lifecycle int64) error {
	turn, err := m.slow.wait(ctx, nodeKey(node, lifecycle))
	if err != nil {
		return authority.Wrap(authority.ErrUnavailable, "capacity escrow: waiting for a reclaim", err)
	}
	if turn.served() {
		return nil
	}
	m.stats.reclaims.Add(1)
	err = m.settle(ctx, shards, h, node, lifecycle, true)
	turn.done(err == nil)
	if err != nil {
		m.cfg.Logger.Warn("capacity escrow: reclaim failed", "mesh", node.MeshName, "node", node.RID, "lifecycle", lifecycle, "error", err)
	}
	return err
}

// settle brings every shard's line of the node lifecycle's ledger (in
// shard h) and its slice together: each shard receives what the ledger
// gave it (a grant whose mover stopped before the slice took it), releases
// its slack when release is set, and the ledger takes back what the slice
// returned (a release whose mover stopped before the ledger learnt it).
// The shards are settled in parallel; the first error is returned after
// all ran.
func (m *Mover) settle(ctx context.Context, shards []Shard, h int, node authority.NodeDescriptor, lifecycle int64, release bool) error {
	led, err := shards[h].Ledger(ctx, node, lifecycle)
	if err != nil {
		return err
	}
	lines := slices.Sorted(maps.Keys(led.Shards))
	errs := make([]error, len(lines))
	var wg sync.WaitGroup
	for k, i := range lines {
		if i >= len(shards) {
			// a shard a resharding added, which this mover has not
			// added yet (its store follows the grown map at its next
			// reload): nothing is decided without it
			errs[k] = authority.Wrap(authority.ErrUnavailable, fmt.Sprintf("capacity escrow: the ledger of %s/%s@%d has a line for shard %d, which this store does not know yet (%d shards)", node.MeshName, node.RID, lifecycle, i, len(shards)), errNotAttached)
			continue
		}
		wg.Go(func() { errs[k] = m.settleShard(ctx, shards, h, i, node, lifecycle, led.Shards[i].Given, release) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// settleShard settles shard i's line (see settle).
func (m *Mover) settleShard(ctx context.Context, shards []Shard, h, i int, node authority.NodeDescriptor, lifecycle int64, given schema.Budget, release bool) error {
	sl, err := shards[i].Receive(ctx, node, lifecycle, given)
	if err != nil {
		return err
	}
	if release {
		if sl, err = shards[i].Release(ctx, node, lifecycle); err != nil {
			return err
		}
	}
	_, err = shards[h].Credit(ctx, node, lifecycle, i, sl.Returned)
	return err
}

// Reconcile finishes every transfer of the node lifecycle's budget that a
// mover left in flight (it crashed, or its context ended, between the two
// steps of a grant or of a release), so no budget stays counted in the
// ledger without being in a slice. It is idempotent and safe next to
// running movers and stores.
func (m *Mover) Reconcile(ctx context.Context, node authority.NodeDescriptor, lifecycle int64) error {
	shards, h, err := m.forNode(node)
	if err != nil {
		return err
	}
	return m.settle(ctx, shards, h, node, lifecycle, false)
}

// Reclaim is Reconcile that also gives every shard's slack back to the
// ledger: after it, the policy decides the node lifecycle's next grants on
// its usage alone. Call it after lowering a limit (SetCapacityPolicy):
// slack granted under the old policy stays usable until it is reclaimed.
func (m *Mover) Reclaim(ctx context.Context, node authority.NodeDescriptor, lifecycle int64) error {
	shards, h, err := m.forNode(node)
	if err != nil {
		return err
	}
	return m.reclaim(ctx, shards, h, node, lifecycle)
}

func (m *Mover) forNode(node authority.NodeDescriptor) ([]Shard, int, error) {
	shards, err := m.ready()
	if err != nil {
		return nil, 0, err
	}
	h, err := m.home(node, len(shards))
	return shards, h, err
}

// ReconcileAll reconciles every node lifecycle that has a ledger in any
// shard (Reconcile), or reclaims it when reclaim is set (Reclaim), and
// returns how many it visited. A ledger found outside its node's home
// shard (a Home that changed) is left alone and reported (ErrCorrupt);
// every other node lifecycle is still visited.
func (m *Mover) ReconcileAll(ctx context.Context, reclaim bool) (int, error) {
	shards, err := m.ready()
	if err != nil {
		return 0, err
	}
	var errs []error
	visited := 0
	for h, sh := range shards {
		nodes, err := sh.Ledgers(ctx)
		if err != nil {
			errs = append(errs, err)
		}
		for _, nl := range nodes {
			if home, herr := m.home(nl.Node, len(shards)); herr != nil || home != h {
				errs = append(errs, authority.Wrap(authority.ErrCorrupt, fmt.Sprintf(
					"capacity escrow: the ledger of %s/%s@%d is in shard %d, not its home shard", nl.Node.MeshName, nl.Node.RID, nl.Lifecycle, h), herr))
				continue
			}
			visited++
			if reclaim {
				err = m.reclaim(ctx, shards, h, nl.Node, nl.Lifecycle)
			} else {
				err = m.settle(ctx, shards, h, nl.Node, nl.Lifecycle, false)
			}
			if err != nil {
				errs = append(errs, err)
			}
			if ctx.Err() != nil {
				return visited, errors.Join(append(errs, ctx.Err())...)
			}
		}
	}
	err = errors.Join(errs...)
	m.cfg.Logger.Info("capacity escrow: reconciled", "nodeLifecycles", visited, "reclaim", reclaim, "error", err)
	return visited, err
}
