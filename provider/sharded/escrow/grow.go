package escrow

import (
	"context"
	"errors"
	"fmt"

	authority "github.com/zlink-systems/authority"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
)

// maxCount is the largest count of a capacity vector (the contract's).
const maxCount = 0x7fff_ffff

// Grow makes room in shard s's slice of req's node lifecycle for req.Need
// next to the usage there (etcdstore.CapacityEscrow, through Hook):
//
//  1. it reads the slice and usage in s; a slice that holds Need already
//     (another mover grew it) needs nothing;
//  2. the home shard's ledger grants the first of its asks (Mover.asks:
//     from 2^31-1 on each counter of the waiting requests, what a policy
//     that does not limit them admits, down to Need alone) that the policy
//     admits on top of everything granted; s's slice receives it;
//  3. when the policy admits none, every transfer in flight is finished and
//     every shard's slack, s's included, goes back to the ledger
//     (reclaim), and step 2 runs once more, from Want down: a refusal then
//     is an error wrapping etcdstore.ErrBudgetExhausted.
//
// A crash or a cancelled ctx between the ledger's grant and the slice's
// receipt leaves the grant in flight: counted as granted, in no slice,
// until a reclaim or Reconcile applies it to the slice.
func (m *Mover) Grow(ctx context.Context, s int, req etcdstore.BudgetRequest) error {
	shards, err := m.ready()
	if err != nil {
		return err
	}
	if s < 0 || s >= 1<<16 {
		return authority.Invalid(fmt.Sprintf("escrow: shard %d of %d.", s, len(shards)))
	}
	if s >= len(shards) {
		return authority.Wrap(authority.ErrUnavailable, fmt.Sprintf("capacity escrow: shard %d is not added yet (%d shards)", s, len(shards)), errNotAttached)
	}
	if err := authority.ValidateCapacityVector(req.Need); err != nil {
		return err
	}
	if err := authority.ValidateCapacityVector(req.Want); err != nil {
		return err
	}
	if !covers(req.Want, req.Need) {
		req.Want = req.Need // not Need and more of its shape: ask for Need alone
	}
	h, err := m.home(req.Node, len(shards))
	if err != nil {
		return err
	}
	m.stats.grows.Add(1)
	for round := 0; ; round++ {
		st, err := shards[s].Slice(ctx, req.Node, req.Lifecycle)
		if err != nil {
			return err
		}
		asks := m.asks(st, req, round == 0)
		if len(asks) == 0 {
			return nil // the slice holds Need already
		}
		led, err := shards[h].Grant(ctx, req.Node, req.Lifecycle, s, asks...)
		if err == nil {
			m.stats.grants.Add(1)
			_, err = shards[s].Receive(ctx, req.Node, req.Lifecycle, led.Shards[s].Given)
			return err
		}
		if !errors.Is(err, etcdstore.ErrBudgetExhausted) {
			return err
		}
		if round == 1 {
			m.stats.exhausted.Add(1)
			return err
		}
		if err := m.reclaim(ctx, shards, h, req.Node, req.Lifecycle); err != nil {
			return err
		}
	}
}

// asks are what Grow asks the ledger for, largest first, each what the
// slice lacks for it next to the usage (none when the slice holds Need):
// with chunk, the most a vector counts on Want's counters, then Chunk
// times Want, Want plus half as many more, and so on; then Want, half of
// it, a quarter, ..., down to Need. The ledger grants the first the policy
// admits, all decided on one read, so a batch near the limit takes what
// the policy still admits in one grant.
func (m *Mover) asks(st etcdstore.SliceState, req etcdstore.BudgetRequest, chunk bool) []authority.CapacityVector {
	need, ok := shortfall(st, req.Need)
	if !ok {
		return nil
	}
	var asks []authority.CapacityVector
	add := func(c authority.CapacityVector) {
		if short, ok := shortfall(st, c); ok {
			for _, a := range asks {
				if a.Equal(short) {
					return
				}
			}
			asks = append(asks, short)
		}
	}
	if chunk {
		// all a vector can count first: a policy that does not limit the
		// counter (or no policy) admits it, and the slice never asks the
		// home shard again
		add(scale(req.Want, maxCount))
		// Chunk times the waiting requests, then half as many more, and so
		// on: the more wait, the more the slice takes ahead; near the
		// limit, as many as the policy admits
		for extra := m.cfg.Chunk - 1; extra > 0; extra /= 2 {
			add(plus(req.Want, scale(req.Want, extra)))
		}
	}
	add(req.Want)
	// then half the waiting requests, a quarter, ...: a batch near the
	// limit takes what the policy still admits in one grant
	for h, n := halve(req.Want, req.Need), 0; !h.Equal(req.Need) && n < 64; h, n = halve(h, req.Need), n+1 {
		add(h)
	}
	add(need)
	if !asks[len(asks)-1].Equal(need) {
		asks = append(asks, need) // Want's shortfall may not cover Need's (another shape)
	}
	return asks
}

// shortfall is what the slice of st lacks to hold c next to the usage,
// counter by counter (a vector of c's shape); false when it lacks nothing.
func shortfall(st etcdstore.SliceState, c authority.CapacityVector) (authority.CapacityVector, bool) {
	size := st.Slice.Size()
	lack := func(n int64, counter schema.BudgetCounter) int64 {
		if n == 0 {
			return 0
		}
		return min(maxCount, max(0, st.Usage[counter]+n-size[counter]))
	}
	out := authority.CapacityVector{
		Actors: lack(c.Actors, schema.BudgetCounter{Kind: authority.ObjectActor}),
		Spots:  lack(c.Spots, schema.BudgetCounter{Kind: authority.CounterSpots}),
	}
	if c.SpotType != nil {
		if n := lack(c.SpotType.Count, schema.BudgetCounter{Kind: c.SpotType.ObjectKind, StableType: c.SpotType.StableType}); n > 0 {
			st := *c.SpotType
			st.Count = n
			out.SpotType = &st
		}
	}
	return out, out.Actors > 0 || out.Spots > 0 || out.SpotType != nil
}

// covers reports whether a counts the counters of b, each at least as
// much, and no others.
func covers(a, b authority.CapacityVector) bool {
	if (a.Actors == 0) != (b.Actors == 0) || (a.Spots == 0) != (b.Spots == 0) || (a.SpotType == nil) != (b.SpotType == nil) ||
		a.Actors < b.Actors || a.Spots < b.Spots {
		return false
	}
	return b.SpotType == nil || a.SpotType.ObjectKind == b.SpotType.ObjectKind && a.SpotType.StableType == b.SpotType.StableType &&
		a.SpotType.Count >= b.SpotType.Count
}

// halve halves every count of c (rounding up), never below floor's.
func halve(c, floor authority.CapacityVector) authority.CapacityVector {
	h := func(n, f int64) int64 { return max(f, (n+1)/2) }
	out := authority.CapacityVector{Actors: h(c.Actors, floor.Actors), Spots: h(c.Spots, floor.Spots)}
	if c.SpotType != nil {
		st := *c.SpotType
		if floor.SpotType != nil {
			st.Count = h(st.Count, floor.SpotType.Count)
		} else {
			st.Count = h(st.Count, 0)
		}
		out.SpotType = &st
	}
	return out
}

// scale multiplies every count of c by k, up to the contract's bound.
func scale(c authority.CapacityVector, k int64) authority.CapacityVector {
	mul := func(n int64) int64 {
		if n > 0 && k > maxCount/n {
			return maxCount
		}
		return n * k
	}
	out := authority.CapacityVector{Actors: mul(c.Actors), Spots: mul(c.Spots)}
	if c.SpotType != nil {
		st := *c.SpotType
		st.Count = mul(st.Count)
		out.SpotType = &st
	}
	return out
}

// plus adds two vectors of one shape, up to the contract's bound (a Spot
// type other than a's is left out).
func plus(a, b authority.CapacityVector) authority.CapacityVector {
	add := func(x, y int64) int64 { return min(maxCount, x+y) }
	out := authority.CapacityVector{Actors: add(a.Actors, b.Actors), Spots: add(a.Spots, b.Spots)}
	if a.SpotType != nil {
		st := *a.SpotType
		if b.SpotType != nil && b.SpotType.ObjectKind == st.ObjectKind && b.SpotType.StableType == st.StableType {
			st.Count = add(st.Count, b.SpotType.Count)
		}
		out.SpotType = &st
	}
	return out
}
