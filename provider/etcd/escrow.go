package etcd

import (
	"context"
	"errors"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/provider/etcd/internal/txnkit"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Escrow mode: the budget fence of reservations and aggregate prepares.
//
// A namespace spread over several etcd clusters (shards, package
// provider/sharded) counts a node lifecycle's capacity in every shard its
// rows live in, and no Txn spans two clusters. In escrow mode
// (Config.CapacityEscrow) each shard holds a budget slice of every node
// lifecycle (schema.BudgetSlice), and a reservation or an aggregate prepare
// on the node is admitted in this shard only if, besides the capacity
// policy's answer on this shard's usage, this shard's usage plus what it
// asks stays within the slice, counter by counter. Its Txn compares the
// slice's ModRevision next to the capacity epoch, so a slice that shrank
// since the read (Release, which compares the epoch in turn) fails it.
// When the slice is short, the store asks the escrow (CapacityEscrow.Grow)
// to move budget into it, and decides again. The slices together never hold
// more than the ledger granted, and the ledger grants only what the policy
// admits on top of everything granted: docs/design-etcd.md "Capacity escrow
// across shards" has the argument.

// CapacityEscrow moves capacity budget into a store's budget slices: the
// hook of escrow mode (Config.CapacityEscrow). Package provider/sharded/escrow
// implements it over the shards of a namespace.
type CapacityEscrow interface {
	// Grow makes room in this store's slice of req's node lifecycle for
	// req.Need next to the usage the slice holds now (and for req.Want
	// when the policy admits it). nil: the slice may have grown, the caller
	// decides again. An error wrapping ErrBudgetExhausted: the capacity
	// policy refuses req.Need on top of the node's usage in every shard
	// after every shard's slack was taken back. Any other error: nothing
	// was decided.
	Grow(ctx context.Context, req BudgetRequest) error
}

// BudgetRequest is what a store in escrow mode asks its CapacityEscrow for.
type BudgetRequest struct {
	// Node and Lifecycle are the node lifecycle whose slice is short.
	Node      authority.NodeDescriptor
	Lifecycle int64
	// Need is the capacity of the first request that did not fit the
	// slice: the slice must hold it next to the usage.
	Need authority.CapacityVector
	// Want is Need plus the capacity of the requests of its shape waiting
	// behind it (Want ≥ Need): what the escrow grants at once when the
	// policy admits it.
	Want authority.CapacityVector
}

// ErrBudgetExhausted is the cause of a CapacityEscrow.Grow or
// BudgetSteps.Grant refused by the capacity policy: the reservation that
// asked is placementCapacityExhausted (an aggregate prepare: conflict).
var ErrBudgetExhausted = errors.New("capacity budget exhausted: the capacity policy refuses it on top of the budget granted")

// sliceFence is the budget slice a decision read (escrow mode; on false
// otherwise, and then every placement fits it).
type sliceFence struct {
	on   bool
	key  string
	rev  int64         // its ModRevision at the read (0: absent)
	size schema.Budget // Received - Returned
}

// addSliceRead appends the read of the node lifecycle's budget slice to ops
// in escrow mode.
func (s *Store) addSliceRead(ops []clientv3.Op, ur *usageRead) []clientv3.Op {
	if s.escrow == nil {
		return ops
	}
	ur.sliceKey = s.keys.BudgetSlice(ur.node, ur.lifecycle)
	return append(ops, opGet(ur.sliceKey))
}

// sliceAt returns the slice read at ur in resp (a zero sliceFence outside
// escrow mode).
func (s *Store) sliceAt(resp *clientv3.TxnResponse, ur usageRead) (sliceFence, error) {
	if ur.sliceKey == "" {
		return sliceFence{}, nil
	}
	f := sliceFence{on: true, key: ur.sliceKey, size: schema.Budget{}}
	if kv := txnkit.KVNamed(resp, ur.sliceKey); kv != nil {
		sl, err := schema.DecodeBudgetSlice(kv)
		if err != nil {
			return f, err
		}
		f.rev, f.size = kv.ModRevision, sl.Size()
	}
	return f, nil
}

// holds reports whether alloc fits the slice next to the usage u, counter
// by counter (always, outside escrow mode).
func (f sliceFence) holds(alloc authority.PlacementAllocation, u nodeUsage) bool {
	if !f.on {
		return true
	}
	for _, e := range alloc.Entries() {
		if u.reserved[e.Counter]+u.active[e.Counter]+e.Count > f.size[schema.BudgetCounterOf(e.Counter)] {
			return false
		}
	}
	return true
}

// fence adds to t the condition that the slice is as read: a Release since
// the read (which shrinks it) fails t. A grow fails it too, and the caller
// decides again.
func (f sliceFence) fence(t *txnkit.Txn) {
	if f.on {
		t.Cmp(modRevIs(f.key, f.rev))
	}
}

// fenceCmps is how many compares the fences add to a reservation Txn: the
// capacity epoch, in escrow mode the slice, and the shard map's.
func (s *Store) fenceCmps() int {
	n := 1
	if s.escrow != nil {
		n++
	}
	if s.mapFenced() {
		n++ // the map fence (shardfence.go)
	}
	return n
}

// grow asks the escrow for room for need (and want) on the node lifecycle's
// slice: exhausted when the policy refuses need. An error means the
// caller's own write was not sent.
func (s *Store) grow(ctx context.Context, node authority.NodeDescriptor, lifecycle int64, need, want authority.CapacityVector) (exhausted bool, err error) {
	err = s.escrow.Grow(ctx, BudgetRequest{Node: node, Lifecycle: lifecycle, Need: need.Clone(), Want: want.Clone()})
	switch {
	case err == nil:
		return false, nil
	case errors.Is(err, ErrBudgetExhausted):
		return true, nil
	case ctx.Err() != nil:
		return false, txnkit.NotSent(ctx.Err(), "its node's capacity budget")
	case errors.Is(err, authority.ErrOutcomeUnknown) || !classified(err):
		// the escrow's own write had an unknown outcome (harmless: a
		// transfer is completed by whoever reconciles), or it failed in a
		// way it did not classify: the caller's write was not sent
		return false, authority.Wrap(authority.ErrUnavailable, "etcd write not sent: growing its node's capacity budget failed ("+err.Error()+")", nil)
	}
	return false, err
}

// classified reports whether err wraps one of the contract's sentinels.
func classified(err error) bool {
	for _, sentinel := range []error{authority.ErrUnavailable, authority.ErrClosed, authority.ErrInvalidArgument,
		authority.ErrCorrupt, authority.ErrLimitExceeded, authority.ErrAccessDenied, authority.ErrUnsupportedServer,
		ErrVersionSkew} {
		if errors.Is(err, sentinel) {
			return true
		}
	}
	return false
}

// growShort ends a reservation round that admitted nothing and left some
// requests short of the slice: it asks the escrow to grow the slice for the
// first of them (and the others of its shape), then every request still
// pending is decided again on a new snapshot. A refusal makes that first
// request placementCapacityExhausted, and with it every short request of
// its shape asking at least as much (the policy is monotone: escrow's
// assumption). false when no request was short.
func (g *groupRun) growShort(r groupRound) bool {
	first := -1
	var want authority.CapacityVector
	for _, i := range g.pending {
		if r.decisions[i] != decideShort {
			continue
		}
		c := g.batch[i].res.row.Alloc.Capacity
		if first < 0 {
			first, want = i, c.Clone()
		} else if sameShape(c, want) {
			want, _ = authority.AddCapacity(want, c)
		}
	}
	if first < 0 {
		return false
	}
	g.settleUnwritten(r) // the exhausted ones are final; the short and deferred ones stay
	exhausted, err := g.s.grow(g.ctx, g.node, g.lifecycle, g.batch[first].res.row.Alloc.Capacity, want)
	g.grows++
	switch {
	case err != nil:
		g.fail(g.pending, err)
	case exhausted:
		// refused on top of what the node holds: so is every request short
		// of the slice asking at least as much on the same counters
		need := g.batch[first].res.row.Alloc.Capacity
		next := g.pending[:0:0]
		for _, i := range g.pending {
			if c := g.batch[i].res.row.Alloc.Capacity; r.decisions[i] == decideShort && sameShape(c, need) && atLeast(c, need) {
				g.outs[i].out = authority.ReserveResult{Kind: authority.KindPlacementCapacityExhausted}
				continue
			}
			next = append(next, i)
		}
		g.pending = next
	case g.grows >= maxAttempts:
		g.fail(g.pending, authority.Wrap(authority.ErrUnavailable, "reserve gave up: its node's capacity budget kept moving to other shards", errContention))
	}
	return true
}

// sameShape reports whether a and b count the same counters (so their sum
// is one more request of that shape).
func sameShape(a, b authority.CapacityVector) bool {
	if (a.Actors == 0) != (b.Actors == 0) || (a.Spots == 0) != (b.Spots == 0) || (a.SpotType == nil) != (b.SpotType == nil) {
		return false
	}
	return a.SpotType == nil || a.SpotType.ObjectKind == b.SpotType.ObjectKind && a.SpotType.StableType == b.SpotType.StableType
}

// atLeast reports whether a counts at least b on every counter (of one
// shape).
func atLeast(a, b authority.CapacityVector) bool {
	return a.Actors >= b.Actors && a.Spots >= b.Spots && (b.SpotType == nil || a.SpotType.Count >= b.SpotType.Count)
}

// growForPrepare asks the escrow for room for the target capacity an
// aggregate's prepare reserves in this store: nil, nil means evaluate
// again; a conflict when the policy refuses it.
func (p *aggregatePrepare) growForPrepare(ctx context.Context, capacity authority.CapacityVector) (*authority.PrepareAggregateResult, error) {
	exhausted, err := p.s.grow(ctx, p.target.Descriptor, p.target.DescriptorLifecycleGeneration, capacity, capacity)
	switch {
	case err != nil:
		return nil, err
	case exhausted:
		return p.conflict(), nil
	}
	return nil, nil
}
