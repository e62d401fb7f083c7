package coordinator

// Taking over, after a restart, an activation reserved before it.

import (
	"bytes"
	"context"

	authority "github.com/zlink-systems/authority"
)

// PendingActivation is the pending projection of a reserved Instance row, as
// a restarted node finds it.
type PendingActivation struct {
	StoreVersion             authority.StoreVersion
	ObjectGeneration         int64
	AuthorityOwnerGeneration int64
	OwnerID                  string
	OwnerLeaseGeneration     int64
	MeshName                 string
	NodeRID                  string
	NodeGeneration           int64
	ReservationID            string
	RequestReference         string
	RequestSHA256            []byte
	RequestEncodedSize       int64
	// OwnershipToken is the reserved row's fencing token.
	OwnershipToken int64
}

// PendingActivationOf returns the pending projection of a reserved Instance
// row; ok is false for any other row.
func PendingActivationOf(s *authority.Snapshot) (p PendingActivation, ok bool) {
	if s == nil || s.PendingCreation == nil || s.Allocation.State != authority.AllocationReserved ||
		s.Allocation.ObjectKind != authority.ObjectInstanceSpot {
		return PendingActivation{}, false
	}
	return PendingActivation{
		StoreVersion: s.StoreVersion, ObjectGeneration: s.ObjectGeneration,
		AuthorityOwnerGeneration: s.AuthorityOwnerGeneration,
		OwnerID:                  s.OwnerID, OwnerLeaseGeneration: s.OwnerLeaseGeneration,
		MeshName: s.Allocation.Descriptor.MeshName, NodeRID: s.Allocation.Descriptor.RID,
		NodeGeneration:     s.Allocation.DescriptorLifecycleGeneration,
		ReservationID:      s.PendingCreation.ReservationID,
		RequestReference:   s.PendingCreation.RequestContentReference,
		RequestSHA256:      bytes.Clone(s.PendingCreation.RequestSHA256),
		RequestEncodedSize: s.PendingCreation.RequestEncodedSize,
		OwnershipToken:     s.OwnershipToken,
	}, true
}

// Resume takes over, after a restart, the reserved activation whose pending
// projection is pending. The row must still be exactly that reservation
// (else KindSpotGenerationStale).
func (a *InstanceActivationAuthority) Resume(ctx context.Context, target ActivationTarget, pending PendingActivation) (ActivationReservation, error) {
	_, cur, err := readSpot(ctx, a.rows(), authority.ObjectInstanceSpot, target.TargetSpotID)
	if err != nil {
		return ActivationReservation{}, err
	}
	var s *authority.Snapshot
	var proj *authority.PendingCreation
	if cur.Kind == authority.KindSnapshot {
		s, proj = cur.Snapshot, cur.Snapshot.PendingCreation
	}
	if s == nil || proj == nil ||
		s.Allocation.State != authority.AllocationReserved ||
		s.Allocation.ObjectKind != authority.ObjectInstanceSpot ||
		s.Allocation.StableType != target.StableType ||
		s.StoreVersion != pending.StoreVersion ||
		s.ObjectGeneration != pending.ObjectGeneration ||
		s.AuthorityOwnerGeneration != pending.AuthorityOwnerGeneration ||
		s.OwnerID != pending.OwnerID ||
		s.OwnerLeaseGeneration != pending.OwnerLeaseGeneration ||
		s.Allocation.Descriptor.MeshName != pending.MeshName ||
		s.Allocation.Descriptor.RID != pending.NodeRID ||
		s.Allocation.DescriptorLifecycleGeneration != pending.NodeGeneration ||
		proj.ReservationID != pending.ReservationID ||
		proj.RequestContentReference != pending.RequestReference ||
		proj.RequestEncodedSize != pending.RequestEncodedSize ||
		!bytes.Equal(proj.RequestSHA256, pending.RequestSHA256) {
		return ActivationReservation{}, newError(KindSpotGenerationStale, "Pending Instance activation recovery fence is stale.", false, nil)
	}
	reservation := ActivationReservation{Attempt: s.ObjectGeneration, AuthorityOwnerGeneration: s.AuthorityOwnerGeneration,
		Token: proj.ReservationID, OwnershipToken: s.OwnershipToken}
	a.mu.Lock()
	a.pending[reservation.Token] = &pendingActivation{
		reservationID: proj.ReservationID, creating: s, owner: s.Owner(),
		requestReference: authority.BlobReference(proj.RequestContentReference),
		requestSHA256:    bytes.Clone(proj.RequestSHA256), requestEncodedSize: proj.RequestEncodedSize,
	}
	a.mu.Unlock()
	return reservation, nil
}
