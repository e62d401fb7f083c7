package etcd

import (
	"bytes"
	"context"

	"github.com/google/uuid"
	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/provider/etcd/internal/txnkit"
	"github.com/zlink-systems/authority/provider/etcd/schema"
)

// maxAttempts bounds every optimistic loop of the store (for a reservation
// batch: the failed Txns of one batch).
const maxAttempts = 16

// reservation is one planned reserve: the row it creates.
type reservation struct {
	key    authority.Key
	target authority.CreationTarget
	row    *schema.Row
}

// liveKey is the liveness key of r's target owner.
func (r *reservation) liveKey(s *Store) string {
	return s.keys.Liveness(r.target.Descriptor(), r.target.NodeLifecycleGeneration, r.target.Owner)
}

// addReserve appends one reservation's conditions and writes to t: the row
// is absent, the target owner is live; the row and where its reserved
// capacity is held (its capacity and owner index entries, or from
// storeversion.FewerKeys on its placement key: placement.go) are written.
// Several reservations (of distinct keys) can share one Txn.
func (s *Store) addReserve(t *txnkit.Txn, r *reservation) {
	rowKey := s.keys.Row(r.key)
	t.Cmp(modRevIs(rowKey, 0))
	t.Cmp(s.liveCmp(r.target.Descriptor(), r.target.NodeLifecycleGeneration, r.target.Owner))
	r.row.PlacementKey = s.placeNew(t, nil)
	t.Put(rowKey, s.rowValue(t, r.row))
	s.place(t, r.row)
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
	res := &reservation{key: key, target: tg, row: &schema.Row{
		Key:   key,
		Owner: tg.Owner,
		Alloc: authority.PlacementAllocation{
			State: authority.AllocationReserved, ObjectKind: req.Key.Kind, StableType: req.Intent.StableType,
			Descriptor: tg.Descriptor(), DescriptorLifecycleGeneration: tg.NodeLifecycleGeneration,
			Capacity: req.Capacity.Clone(),
		},
		Pending: &authority.PendingCreation{
			ReservationID:           uuid.NewString(),
			RequestContentReference: req.Intent.RequestContentReference,
			RequestSHA256:           bytes.Clone(req.Intent.RequestSHA256),
			RequestEncodedSize:      req.Intent.RequestEncodedSize,
		},
		Payload: bytes.Clone(req.CreatingPayload),
	}}
	if s.capacityPolicy() != nil || s.escrow != nil {
		// concurrent reservations on one node share its capacity fence
		// (and in escrow mode its budget slice): group-commit them
		// (reservegroup.go).
		return s.reserveGrouped(ctx, req, res)
	}
	// no capacity policy: nothing shared with other reservations, one Txn.
	rowKey := s.keys.Row(key)
	t := &txnkit.Txn{}
	s.addReserve(t, res)
	t.OrGet(rowKey)
	t.OrGet(s.keys.Liveness(tg.Descriptor(), tg.NodeLifecycleGeneration, tg.Owner))
	resp, err := s.sendWrite(ctx, t, "the reservation")
	if err != nil {
		return authority.ReserveResult{}, err
	}
	if !resp.Succeeded {
		cur, err := s.rowIn(txnkit.ReadsOf(resp), key)
		if err != nil {
			return authority.ReserveResult{}, err
		}
		return s.reserveRefused(req, cur), nil
	}
	created := res.row.Next(0)
	created.Written(resp.Header.Revision)
	created.CreateRev = resp.Header.Revision
	s.remember(created)
	return authority.ReserveResult{
		Kind:          authority.KindReserved,
		ReservationID: created.Pending.ReservationID,
		Creating:      created.Snapshot(s.clock.Now()),
	}, nil
}

// reserveRefused is the outcome when the row exists (cur) or the target is
// not live (cur nil), in the contract's order of checks.
func (s *Store) reserveRefused(req authority.ReserveRequest, cur *schema.Row) authority.ReserveResult {
	if cur == nil {
		return authority.ReserveResult{Kind: authority.KindConflict, Current: authority.Missing(s.clock.Now())}
	}
	current := s.readResult(cur)
	switch {
	case cur.Alloc.ObjectKind != req.Key.Kind || cur.Alloc.StableType != req.Intent.StableType:
		return authority.ReserveResult{Kind: authority.KindTypeMismatch, Current: current}
	case cur.Alloc.State == authority.AllocationActive:
		return authority.ReserveResult{Kind: authority.KindAlreadyExists, Current: current}
	}
	return authority.ReserveResult{Kind: authority.KindConflict, Current: current}
}
