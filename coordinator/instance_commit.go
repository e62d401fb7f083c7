package coordinator

// Committing an activated Instance Spot Ready, and completing it once its
// inbox is replayed.

import (
	"context"
	"fmt"

	authority "github.com/zlink-systems/authority"
)

// ActivatedSpot is the Spot an activation produced, as Commit checks it.
type ActivatedSpot struct {
	StableType string
	SpotID     string
	// Generation must be the reservation's attempt.
	Generation               int64
	AuthorityOwnerGeneration int64
}

// CommitKind is the outcome of Commit.
type CommitKind string

// Commit outcomes.
const (
	// CommitCommitted: this activation's Spot is Ready.
	CommitCommitted CommitKind = "committed"
	// CommitLost: another generation became Ready instead.
	CommitLost CommitKind = "lost"
)

// CommitOutcome is the outcome of Commit.
type CommitOutcome struct {
	Kind  CommitKind
	Route RouteFence
}

// Commit makes the reserved activation's Spot Ready, recording where its
// recovery envelope is and that its inbox has not been replayed yet. If
// another generation won, the outcome is CommitLost with that route.
func (a *InstanceActivationAuthority) Commit(ctx context.Context, target ActivationTarget, reservation ActivationReservation, spot ActivatedSpot) (CommitOutcome, error) {
	p, err := a.requirePending(reservation)
	if err != nil {
		return CommitOutcome{}, err
	}
	if err := requireCommitIdentity(target, reservation, p.creating, spot, a.opts.MeshName); err != nil {
		return CommitOutcome{}, err
	}
	ready, err := EncodeInstancePayload(Payload{
		State: StateReady, StableType: spot.StableType, SpotID: spot.SpotID,
		OwnerID: p.owner.OwnerID, OwnerLeaseGeneration: p.owner.LeaseGeneration,
		OwnerMeshName: a.opts.MeshName, OwnerNodeRID: target.TargetNodeRID, OwnerNodeGeneration: target.TargetNodeGeneration,
		ActivationRecovery: &ActivationRecovery{
			Reference: string(p.requestReference), SHA256: p.requestSHA256, EncodedSize: p.requestEncodedSize,
			InboxSequence: 1, ReplayCursor: 0,
		},
	})
	if err != nil {
		return CommitOutcome{}, err
	}
	res, err := a.opts.Store.Commit(ctx, authority.CommitRequest{
		Key:           authority.ObjectKey{Kind: authority.ObjectInstanceSpot, GlobalID: target.TargetSpotID},
		ReservationID: p.reservationID, ExpectedStoreVersion: p.creating.StoreVersion,
		Target:       a.creationTarget(target, p.owner),
		ReadyPayload: ready,
	})
	if err != nil {
		return CommitOutcome{}, failure(ctx, KindRequestFailed, "Instance Spot Ready commit Store operation failed.", err)
	}
	if res.Kind == authority.KindCommitted || res.Kind == authority.KindAlreadyCommitted {
		a.dropPending(reservation.Token)
		route, err := routeFromSnapshot(res.Ready)
		if err != nil {
			return CommitOutcome{}, err
		}
		if a.opts.OnReady != nil {
			a.opts.OnReady(target, route)
		}
		return CommitOutcome{Kind: CommitCommitted, Route: route}, nil
	}
	_, cur, err := readSpot(ctx, a.rows(), authority.ObjectInstanceSpot, target.TargetSpotID)
	if err != nil {
		return CommitOutcome{}, err
	}
	if cur.Kind == authority.KindSnapshot {
		if r := readyRead(cur.Snapshot, target); r.Kind == ReadReady {
			a.dropPending(reservation.Token)
			return CommitOutcome{Kind: CommitLost, Route: r.Route}, nil
		}
	}
	return CommitOutcome{}, newError(KindRequestFailed, fmt.Sprintf("Instance activation commit failed: %s.", res.Kind), false, nil)
}

func requireCommitIdentity(target ActivationTarget, r ActivationReservation, creating *authority.Snapshot, spot ActivatedSpot, meshName string) error {
	alloc := creating.Allocation
	if alloc.State != authority.AllocationReserved ||
		alloc.ObjectKind != authority.ObjectInstanceSpot ||
		alloc.StableType != target.StableType ||
		creating.ObjectGeneration != r.Attempt ||
		alloc.Descriptor.RID != target.TargetNodeRID ||
		alloc.Descriptor.MeshName != meshName ||
		alloc.DescriptorLifecycleGeneration != target.TargetNodeGeneration ||
		spot.StableType != target.StableType ||
		spot.SpotID != target.TargetSpotID ||
		spot.Generation != r.Attempt ||
		spot.AuthorityOwnerGeneration != creating.AuthorityOwnerGeneration {
		return newError(KindSpotGenerationStale, "Instance activation Ready identity does not match its exact reservation.", false, nil)
	}
	return nil
}

// Complete finishes a committed activation: it durably records the replay
// cursor at the inbox sequence, then releases the inbox (drops the recovery
// record from the payload), then deletes the recovery envelope blob. Each
// step is fenced on the row's version, so a retried Complete resumes where a
// failed one stopped.
func (a *InstanceActivationAuthority) Complete(ctx context.Context, target ActivationTarget, route RouteFence) (RouteFence, error) {
	key, read, err := readSpot(ctx, a.rows(), authority.ObjectInstanceSpot, target.TargetSpotID)
	if err != nil {
		return RouteFence{}, err
	}
	if read.Kind != authority.KindSnapshot {
		return RouteFence{}, newError(KindSpotMoving, "Instance activation authority disappeared before inbox release.", false, nil)
	}
	current := read.Snapshot
	decoded, ok := DecodeReadySpot(current.Payload)
	if !ok || decoded.Kind != authority.ObjectInstanceSpot ||
		decoded.SpotID != target.TargetSpotID ||
		decoded.StableType != target.StableType ||
		current.Allocation.State != authority.AllocationActive ||
		current.ObjectGeneration != route.ObjectGeneration ||
		current.AuthorityOwnerGeneration != route.AuthorityOwnerGeneration ||
		current.OwnerID != route.OwnerID ||
		current.OwnerLeaseGeneration != route.LeaseGeneration ||
		current.Allocation.DescriptorLifecycleGeneration != route.TargetNodeGeneration ||
		current.Allocation.Descriptor.RID != route.TargetNodeRID {
		return RouteFence{}, newError(KindSpotMoving, "Instance activation authority changed before inbox release.", false, nil)
	}
	recovery := decoded.ActivationRecovery
	if recovery == nil {
		return routeFromSnapshot(current)
	}
	completed, err := a.recordReplayCursor(ctx, key, current, decoded)
	if err != nil {
		return RouteFence{}, err
	}
	done, ok := DecodeReadySpot(completed.Payload)
	if !ok || done.Kind != authority.ObjectInstanceSpot || done.ActivationRecovery == nil ||
		done.ActivationRecovery.ReplayCursor != done.ActivationRecovery.InboxSequence {
		return RouteFence{}, newError(KindRequestFailed, "Instance activation terminal completion was not durably recorded.", false, nil)
	}
	released := done
	released.ActivationRecovery = nil
	payload, err := EncodePayload(released)
	if err != nil {
		return RouteFence{}, err
	}
	res, err := a.opts.Store.CompareExchangeAuthority(ctx, key, completed.StoreVersion, authority.Put(payload))
	if err != nil {
		return RouteFence{}, failure(ctx, KindRequestFailed, "Instance activation inbox release Store operation failed.", err)
	}
	if res.Kind != authority.KindStored {
		return RouteFence{}, newError(KindRequestFailed, fmt.Sprintf("Instance activation inbox release failed: %s.", res.Kind), false, nil)
	}
	a.deleteOrphan(ctx, authority.BlobReference(recovery.Reference))
	return routeFromSnapshot(res.Snapshot)
}

// recordReplayCursor durably records, fenced on current's version, that the
// Ready row's inbox is replayed up to its sequence. It returns the row as
// written (current when its cursor is already there).
func (a *InstanceActivationAuthority) recordReplayCursor(ctx context.Context, key authority.Key, current *authority.Snapshot, ready Payload) (*authority.Snapshot, error) {
	rec := *ready.ActivationRecovery
	if rec.ReplayCursor >= rec.InboxSequence {
		return current, nil
	}
	rec.ReplayCursor = rec.InboxSequence
	ready.ActivationRecovery = &rec
	payload, err := EncodePayload(ready)
	if err != nil {
		return nil, err
	}
	res, err := a.opts.Store.CompareExchangeAuthority(ctx, key, current.StoreVersion, authority.Put(payload))
	if err != nil {
		return nil, failure(ctx, KindRequestFailed, "Instance activation terminal completion Store operation failed.", err)
	}
	if res.Kind != authority.KindStored {
		return nil, newError(KindRequestFailed, fmt.Sprintf("Instance activation terminal completion record failed: %s.", res.Kind), false, nil)
	}
	return res.Snapshot, nil
}
