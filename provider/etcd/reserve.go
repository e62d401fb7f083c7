package etcd

import (
	"bytes"
	"context"

	"github.com/google/uuid"
	authority "github.com/zlink-systems/authority"
)

// maxAttempts bounds every optimistic loop of the store.
const maxAttempts = 16

// reservation is one planned reserve: the row it creates.
type reservation struct {
	key    authority.Key
	target authority.CreationTarget
	row    *row
}

// addReserve appends one reservation's conditions and writes to t: the row
// is absent, the target owner is live; the row, its reserved capacity entry
// and its owner index entry are written. Several reservations (of distinct
// keys) can share one Txn.
func (s *Store) addReserve(t *txn, r *reservation) {
	rowKey := s.keys.row(r.key)
	t.cmp(modRevIs(rowKey, 0))
	t.cmp(s.liveCmp(r.target.Descriptor(), r.target.NodeLifecycleGeneration, r.target.Owner))
	t.put(rowKey, r.row.encode(true))
	t.put(s.keys.capacityRow(r.row.alloc, r.key), capacityValue(r.row.alloc.Capacity))
	t.put(s.keys.ownerRow(r.target.Owner, r.key), "")
}

// Reserve creates a reserved row on a live target with placement capacity.
// Without a capacity policy it is one Txn; with one, a read of the node's
// capacity entries and a Txn fenced on them.
func (s *Store) Reserve(ctx context.Context, req authority.ReserveRequest) (authority.ReserveResult, error) {
	key, err := authority.ValidateReserve(req)
	if err != nil {
		return authority.ReserveResult{}, err
	}
	if err := s.begin(ctx); err != nil {
		return authority.ReserveResult{}, err
	}
	if s.claims != nil && s.claims.IdentityClaimed(key) {
		return authority.ReserveResult{Kind: authority.KindConflict, Current: authority.Missing(s.clock.Now())}, nil
	}
	tg := req.Target
	res := &reservation{key: key, target: tg, row: &row{
		key:   key,
		owner: tg.Owner,
		alloc: authority.PlacementAllocation{
			State: authority.AllocationReserved, ObjectKind: req.Key.Kind, StableType: req.Intent.StableType,
			Descriptor: tg.Descriptor(), DescriptorLifecycleGeneration: tg.NodeLifecycleGeneration,
			Capacity: req.Capacity.Clone(),
		},
		pending: &authority.PendingCreation{
			ReservationID:           uuid.NewString(),
			RequestContentReference: req.Intent.RequestContentReference,
			RequestSHA256:           bytes.Clone(req.Intent.RequestSHA256),
			RequestEncodedSize:      req.Intent.RequestEncodedSize,
		},
		payload: bytes.Clone(req.CreatingPayload),
	}}
	rowKey := s.keys.row(key)
	liveKey := s.keys.liveness(tg.Descriptor(), tg.NodeLifecycleGeneration, tg.Owner)
	for attempt := 0; attempt < maxAttempts; attempt++ {
		t := &txn{}
		s.addReserve(t, res)
		if policy := s.capacityPolicy(); policy != nil {
			// RPC 1: the row, the target's liveness and the node's capacity.
			resp, err := s.read(ctx, opGet(rowKey), opGet(liveKey), s.capacityRangeOp(res.row.alloc.Descriptor, tg.NodeLifecycleGeneration))
			if err != nil {
				return authority.ReserveResult{}, err
			}
			cur, err := s.rowFrom(resp, 0, key)
			if err != nil {
				return authority.ReserveResult{}, err
			}
			if cur != nil || firstKv(resp, 1) == nil {
				return s.reserveRefused(req, cur), nil
			}
			u, err := s.sumUsage(res.row.alloc.Descriptor, tg.NodeLifecycleGeneration, rangeKvs(resp, 2))
			if err != nil {
				return authority.ReserveResult{}, err
			}
			if !fits(policy, res.row.alloc, u) {
				return authority.ReserveResult{Kind: authority.KindPlacementCapacityExhausted}, nil
			}
			t.cmp(s.capacityFence(res.row.alloc.Descriptor, tg.NodeLifecycleGeneration, resp.Header.Revision))
		}
		t.orGet(rowKey)
		t.orGet(liveKey)
		resp, err := s.commit(ctx, t, "the reservation")
		if err != nil {
			return authority.ReserveResult{}, err
		}
		if resp.Succeeded {
			created := res.row.next(resp.Header.Revision)
			created.createRev, created.ownerGen = resp.Header.Revision, resp.Header.Revision
			s.remember(created)
			return authority.ReserveResult{
				Kind:          authority.KindReserved,
				ReservationID: created.pending.ReservationID,
				Creating:      created.snapshot(s.clock.Now()),
			}, nil
		}
		cur, err := s.rowFrom(resp, 0, key)
		if err != nil {
			return authority.ReserveResult{}, err
		}
		if cur != nil || firstKv(resp, 1) == nil {
			return s.reserveRefused(req, cur), nil
		}
		// only the capacity fence failed: another write on the node; retry.
	}
	return authority.ReserveResult{}, authority.Wrap(authority.ErrUnavailable, "reserve gave up after repeated capacity contention", errContention)
}

// reserveRefused is the outcome when the row exists (cur) or the target is
// not live (cur nil), in the seed's order.
func (s *Store) reserveRefused(req authority.ReserveRequest, cur *row) authority.ReserveResult {
	if cur == nil {
		return authority.ReserveResult{Kind: authority.KindConflict, Current: authority.Missing(s.clock.Now())}
	}
	current := s.readResult(cur)
	switch {
	case cur.alloc.ObjectKind != req.Key.Kind || cur.alloc.StableType != req.Intent.StableType:
		return authority.ReserveResult{Kind: authority.KindTypeMismatch, Current: current}
	case cur.alloc.State == authority.AllocationActive:
		return authority.ReserveResult{Kind: authority.KindAlreadyExists, Current: current}
	}
	return authority.ReserveResult{Kind: authority.KindConflict, Current: current}
}
