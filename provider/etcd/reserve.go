package etcd

import (
	"bytes"
	"context"

	"github.com/google/uuid"
	authority "github.com/zlink-systems/authority"
)

// maxAttempts bounds every optimistic loop of the store (for a reservation
// batch: the failed Txns of one batch).
const maxAttempts = 16

// reservation is one planned reserve: the row it creates.
type reservation struct {
	key    authority.Key
	target authority.CreationTarget
	row    *row
}

// liveKey is the liveness key of r's target owner.
func (r *reservation) liveKey(s *Store) string {
	return s.keys.liveness(r.target.Descriptor(), r.target.NodeLifecycleGeneration, r.target.Owner)
}

// addReserve appends one reservation's conditions and writes to t: the row
// is absent, the target owner is live; the row, its reserved capacity entry
// and its owner index entry are written. Several reservations (of distinct
// keys) can share one Txn.
func (s *Store) addReserve(t *txn, r *reservation) {
	rowKey := s.keys.row(r.key)
	t.cmp(modRevIs(rowKey, 0))
	t.cmp(s.liveCmp(r.target.Descriptor(), r.target.NodeLifecycleGeneration, r.target.Owner))
	t.put(rowKey, r.row.encode())
	t.put(s.keys.capacityRow(r.row.alloc, r.key), capacityValue(r.row.alloc.State, r.row.alloc.Capacity))
	s.touchCapacity(t, r.row.alloc)
	t.put(s.keys.ownerRow(r.target.Owner, r.key), "")
}

// reserve creates a reserved row on a live target with placement capacity.
// Without a capacity policy it is one Txn; with one, a read of the node's
// capacity entries and a Txn fenced on them, shared with the reservations
// waiting on the same node (group commit).
func (s *Store) reserve(ctx context.Context, req authority.ReserveRequest) (authority.ReserveResult, error) {
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
	if s.capacityPolicy() != nil {
		// concurrent reservations on one node share its capacity fence:
		// group-commit them (reservegroup.go).
		return s.reserveGrouped(ctx, req, res)
	}
	// no capacity policy: nothing shared with other reservations, one Txn.
	rowKey := s.keys.row(key)
	t := &txn{}
	s.addReserve(t, res)
	t.orGet(rowKey)
	t.orGet(s.keys.liveness(tg.Descriptor(), tg.NodeLifecycleGeneration, tg.Owner))
	resp, err := s.sendWrite(ctx, t, "the reservation")
	if err != nil {
		return authority.ReserveResult{}, err
	}
	if !resp.Succeeded {
		cur, err := s.rowIn(readsOf(resp), key)
		if err != nil {
			return authority.ReserveResult{}, err
		}
		return s.reserveRefused(req, cur), nil
	}
	created := res.row.next(0)
	created.written(resp.Header.Revision)
	created.createRev = resp.Header.Revision
	s.remember(created)
	return authority.ReserveResult{
		Kind:          authority.KindReserved,
		ReservationID: created.pending.ReservationID,
		Creating:      created.snapshot(s.clock.Now()),
	}, nil
}

// reserveRefused is the outcome when the row exists (cur) or the target is
// not live (cur nil), in the contract's order of checks.
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
