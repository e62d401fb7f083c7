package etcd

import (
	"context"
	"fmt"
	"time"

	authority "github.com/zlink-systems/authority"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/zlink-systems/authority/provider/etcd/internal/txnkit"
	"github.com/zlink-systems/authority/provider/etcd/schema"
)

// The target's capacity of a cross-shard aggregate, shard by shard. A
// commit moves each newOwner participant's row, and with it its capacity
// entry, onto the target node in the row's own shard; so the prepare
// reserves in every shard exactly the capacity its commit moves into that
// shard (its part): the record's shard in the record's Txn
// (PrepareCrossShard), every other participant shard with ReservePart after
// the record is written. The part is one capacity entry per shard, at the
// key a prepared aggregate's capacity has in one store
// (schema.Layout.CapacityAggregate), checked against the shard's capacity
// policy and, in escrow mode, its budget slice, and fenced as a
// reservation is. A shard's apply turns its part into the moved rows'
// entries in the same Txn; an abort releases it (ReleasePart). Each shard
// thus counts the capacity its commit will hold, and a budget slice is
// never short of what a commit moves in.
//
// ReleasePart leaves the part marker (schema.Layout.AggregatePart, as an
// apply does) naming the incarnation, and ReservePart compares the marker
// as it read it: a reservation of an incarnation whose part was applied or
// released (a late one, of a coordinator that stalled) cannot land.

// PartKind is the outcome of ReservePart.
type PartKind int

// ReservePart outcomes.
const (
	// PartHeld: the part is reserved in this shard (now or before).
	PartHeld PartKind = iota
	// PartRefused: the capacity policy or the budget refuses the part, or
	// the target owner is not live in this shard; nothing written.
	PartRefused
	// PartStale: a newOwner participant's row is not active at its
	// expected version; nothing written.
	PartStale
	// PartFinished: this shard applied or released the incarnation's part
	// already (the aggregate was decided); nothing written.
	PartFinished
)

// movesIn returns the newOwner participants of rec among keys (all in this
// store): the rows whose capacity its commit moves onto the target here.
func movesIn(rec *CrossRecord, keys []authority.Key) ([]authority.AggregateParticipant, error) {
	parts, err := participantsAt(rec, keys)
	if err != nil {
		return nil, err
	}
	var out []authority.AggregateParticipant
	for _, p := range parts {
		if p.OwnerTransition == authority.TransitionNewOwner {
			out = append(out, p)
		}
	}
	return out, nil
}

// partKey is the key of rec's part in this store.
func (s *Store) partKey(req *authority.AggregatePrepareRequest) string {
	reserved := req.TargetAllocation()
	reserved.State = authority.AllocationReserved
	return s.keys.CapacityAggregate(reserved, req.Fence())
}

// ReservePart reserves in this store, a participant shard other than the
// record's, the target capacity that the commit of the prepared rec moves
// into it: the capacity of its newOwner participants at keys (all in this
// store), in one Txn fenced on those rows at their expected versions, on
// the target owner's liveness, the target's capacity epoch and (escrow
// mode) budget slice, the part marker as read and the part absent. A part
// already reserved is PartHeld. Keys without a newOwner participant need
// no part (PartHeld, nothing written).
func (c CrossShard) ReservePart(ctx context.Context, rec *CrossRecord, keys []authority.Key) (PartKind, error) {
	s := c.s
	if err := c.checkRecord(rec, schema.AggregatePrepared, false); err != nil {
		return 0, err
	}
	moving, err := movesIn(rec, keys)
	if err != nil || len(moving) == 0 {
		return PartHeld, err
	}
	if err := s.begin(ctx); err != nil {
		return 0, err
	}
	r := &partReserve{s: s, rec: rec, moving: moving, entry: s.partKey(&rec.Request), marker: s.keys.AggregatePart(rec.Fence())}
	for attempt := 0; attempt < maxAttempts; attempt++ {
		kind, done, err := r.attempt(ctx)
		if err != nil || done {
			return kind, err
		}
	}
	return 0, authority.Wrap(authority.ErrUnavailable, "reserving a cross-shard aggregate's capacity gave up after repeated contention", errContention)
}

// partReserve is one ReservePart: what its attempts share.
type partReserve struct {
	s             *Store
	rec           *CrossRecord
	moving        []authority.AggregateParticipant
	entry, marker string
	fullRange     bool
}

// attempt reads, decides and sends once; done false means "evaluate
// again".
func (r *partReserve) attempt(ctx context.Context) (PartKind, bool, error) {
	s, req := r.s, &r.rec.Request
	target := req.TargetAllocation()
	liveKey := s.keys.Liveness(req.TargetDescriptor, req.TargetDescriptorLifecycleGeneration, req.TargetOwner)
	first := []clientv3.Op{opGet(r.marker), opGet(r.entry), clientv3.OpGet(liveKey, clientv3.WithKeysOnly())}
	policy := s.capacityPolicy()
	var ur usageRead
	if policy != nil || s.escrow != nil {
		first, ur = s.addUsageReads(first, target.Descriptor, target.DescriptorLifecycleGeneration, r.fullRange)
	}
	gets := make([]clientv3.Op, len(r.moving))
	for i, p := range r.moving {
		gets[i] = opGet(s.keys.Row(p.AuthorityKey))
	}
	resp, got, err := s.readWithRows(ctx, first, gets)
	if err != nil {
		return 0, false, err
	}
	if kind, decided, err := r.decided(got); err != nil || decided {
		return kind, true, err
	}
	t := &txnkit.Txn{}
	t.Cmp(modRevIs(r.marker, recordRev(got[r.marker])))
	t.Cmp(modRevIs(r.entry, 0))
	t.Cmp(s.liveCmp(req.TargetDescriptor, req.TargetDescriptorLifecycleGeneration, req.TargetOwner))
	if got[liveKey] == nil {
		return PartRefused, true, nil
	}
	capacity := authority.CapacityVector{}
	for _, p := range r.moving {
		row, err := s.rowIn(got, p.AuthorityKey)
		if err != nil {
			return 0, false, err
		}
		if row == nil || row.Alloc.State != authority.AllocationActive || row.Version() != p.ExpectedStoreVersion {
			return PartStale, true, nil
		}
		t.Cmp(modRevIs(s.keys.Row(p.AuthorityKey), row.ModRev))
		if capacity, err = authority.AddCapacity(capacity, row.Alloc.Capacity); err != nil {
			return 0, false, err
		}
	}
	target.Capacity = capacity
	if policy != nil || s.escrow != nil {
		kind, again, err := r.fenceCapacity(ctx, t, resp, ur, target)
		if err != nil || kind != nil {
			return derefPart(kind), true, err
		}
		if again {
			return 0, false, nil
		}
	}
	return r.send(ctx, t, target)
}

func derefPart(k *PartKind) PartKind {
	if k == nil {
		return 0
	}
	return *k
}

// decided answers from the marker and the part as read: finished when
// this shard applied or released the incarnation's part, held when the
// part is there.
func (r *partReserve) decided(got txnkit.Reads) (PartKind, bool, error) {
	if kv := got[r.marker]; kv != nil {
		m, err := schema.DecodeAggregatePart(kv)
		if err != nil {
			return 0, false, err
		}
		if m.Incarnation == r.rec.Incarnation {
			return PartFinished, true, nil
		}
	}
	if got[r.entry] != nil {
		return PartHeld, true, nil
	}
	return 0, false, nil
}

// fenceCapacity decides the part on the target's usage in this shard (the
// policy, and in escrow mode the slice, growing it when short) and fences
// t on the usage read. It returns the outcome when it decided one, or
// again when the part is to be decided on a new read.
func (r *partReserve) fenceCapacity(ctx context.Context, t *txnkit.Txn, resp *clientv3.TxnResponse, ur usageRead, target authority.PlacementAllocation) (*PartKind, bool, error) {
	s := r.s
	refused := PartRefused
	u, epoch, ok, err := s.usageAt(ctx, resp, ur)
	if err != nil || !ok {
		r.fullRange = err == nil // the watched usage is not that of the read
		return nil, true, err
	}
	if !fits(s.capacityPolicy(), target, u) {
		return &refused, false, nil
	}
	sl, err := s.sliceAt(resp, ur)
	if err != nil {
		return nil, false, err
	}
	if !sl.holds(target, u) {
		exhausted, err := s.grow(ctx, target.Descriptor, target.DescriptorLifecycleGeneration, target.Capacity, target.Capacity)
		if err != nil || !exhausted {
			return nil, true, err // the slice grew: decide again
		}
		return &refused, false, nil
	}
	s.fenceCapacity(t, target.Descriptor, target.DescriptorLifecycleGeneration, epoch)
	sl.fence(t)
	return nil, false, nil
}

// send puts the part (the target's capacity at target) with t's fences.
func (r *partReserve) send(ctx context.Context, t *txnkit.Txn, target authority.PlacementAllocation) (PartKind, bool, error) {
	s := r.s
	if err := s.rowLocksFence(t, "a cross-shard aggregate"); err != nil {
		return 0, false, err
	}
	reserved := target
	reserved.State = authority.AllocationReserved
	t.Put(r.entry, s.capacityValue(t, reserved.State, target.Capacity))
	s.touchCapacity(t, reserved)
	resp, err := s.sendRaw(ctx, t, "reserving a cross-shard aggregate's capacity")
	if err != nil {
		return 0, false, err
	}
	return PartHeld, resp.Succeeded, nil
}

// ReleasePart releases the part of the aborted rec in this store, if it is
// there, and leaves the part marker naming rec's incarnation, so that no
// reservation of it lands after; keys are rec's participants in this
// store. A part released before (the marker there) is left.
func (c CrossShard) ReleasePart(ctx context.Context, rec *CrossRecord, keys []authority.Key) error {
	s := c.s
	if err := c.checkRecord(rec, "", true); err != nil {
		return err
	}
	if rec.State != schema.AggregateAborted {
		return authority.Invalid(fmt.Sprintf("aggregate %s/%d is %s: only an aborted one's capacity is released", rec.Request.AggregateID, rec.Request.AggregateGeneration, rec.State))
	}
	moving, err := movesIn(rec, keys)
	if err != nil || len(moving) == 0 {
		return err
	}
	if err := s.refuseWrite(); err != nil {
		return err
	}
	if err := s.begin(ctx); err != nil {
		return err
	}
	entry, marker := s.partKey(&rec.Request), s.keys.AggregatePart(rec.Fence())
	for attempt := 0; attempt < maxAttempts; attempt++ {
		got, err := s.readInParts(ctx, []clientv3.Op{opGet(entry), opGet(marker)})
		if err != nil {
			return err
		}
		if kv := got[marker]; kv != nil {
			m, err := schema.DecodeAggregatePart(kv)
			if err != nil || m.Incarnation == rec.Incarnation {
				return err // released before
			}
		}
		t := &txnkit.Txn{}
		t.Cmp(modRevIs(marker, recordRev(got[marker])))
		t.Cmp(modRevIs(entry, recordRev(got[entry])))
		if got[entry] != nil {
			reserved := rec.Request.TargetAllocation()
			reserved.State = authority.AllocationReserved
			t.Del(entry)
			s.touchCapacity(t, reserved)
		}
		ok, err := c.putMarker(ctx, t, marker, schema.AggregatePart{Incarnation: rec.Incarnation})
		if err != nil || ok {
			return err
		}
	}
	return authority.Wrap(authority.ErrUnavailable, "releasing a cross-shard aggregate's capacity gave up after repeated contention", errContention)
}

// putMarker sends t with the put of the part marker m on a lease of the
// store's retention (it expires with the record).
func (c CrossShard) putMarker(ctx context.Context, t *txnkit.Txn, marker string, m schema.AggregatePart) (bool, error) {
	s := c.s
	var ok bool
	err := s.leases.withLeases(ctx, []time.Duration{s.retention}, func(ids []clientv3.LeaseID) error {
		tt := t.Clone()
		tt.Put(marker, m.Encode(), clientv3.WithLease(ids[0]))
		resp, err := s.sendRaw(ctx, tt, "releasing a cross-shard aggregate's capacity")
		ok = err == nil && resp.Succeeded
		return err
	})
	return ok, err
}

// Withdraw deletes from this store, its coordinator shard, the aborted and
// finished cross-shard record rec (every shard's part and locks released),
// if it is still at its revision: a prepare refused in a participant shard
// leaves no record, and its fence may be prepared again at once. It
// returns whether this call deleted it.
func (c CrossShard) Withdraw(ctx context.Context, rec *CrossRecord) (bool, error) {
	s := c.s
	if err := c.checkRecord(rec, "", true); err != nil {
		return false, err
	}
	if rec.State != schema.AggregateAborted || !rec.Finished {
		return false, authority.Invalid(fmt.Sprintf("aggregate %s/%d is %s (finished %v): only an aborted and finished record is withdrawn",
			rec.Request.AggregateID, rec.Request.AggregateGeneration, rec.State, rec.Finished))
	}
	if err := s.begin(ctx); err != nil {
		return false, err
	}
	aggKey := s.keys.Aggregate(rec.Fence())
	t := &txnkit.Txn{}
	t.Cmp(modRevIs(aggKey, rec.Revision))
	t.Del(aggKey)
	resp, err := s.sendRaw(ctx, t, "withdrawing a cross-shard aggregate")
	if err != nil {
		return false, err
	}
	return resp.Succeeded, nil
}
