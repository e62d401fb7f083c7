package coordinator

// Reserving an Instance Spot activation: the recovery envelope, the
// reservation, waiting out a close or joining a concurrent activation, and
// aborting.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"time"

	authority "github.com/zlink-systems/authority"
)

// ActivationReservation is an activation this authority reserved (or
// resumed).
type ActivationReservation struct {
	// Attempt is the reserved row's object generation.
	Attempt                  int64
	AuthorityOwnerGeneration int64
	// Token is the reservation ID.
	Token string
	// OwnershipToken is the reserved row's fencing token
	// (authority.Snapshot.OwnershipToken). A commit keeps it: the activated
	// Instance Spot's code fences its effects with it from the start.
	OwnershipToken int64
}

// ReserveKind is the outcome of Reserve.
type ReserveKind string

// Reserve outcomes.
const (
	// ReserveReserved: this caller holds the reservation and must Commit or
	// Abort it.
	ReserveReserved ReserveKind = "reserved"
	// ReserveReady: the Instance Spot is Ready (already, or through a
	// concurrent activation this caller joined).
	ReserveReady ReserveKind = "ready"
)

// ReserveOutcome is the outcome of Reserve.
type ReserveOutcome struct {
	Kind        ReserveKind
	Reservation ActivationReservation
	Route       RouteFence
}

// Reserve reserves an activation of act.Target on this node. The recovery
// envelope is stored as a relocation blob first and verified by reading it
// back; the blob is deleted again on every path that does not end in a
// reservation. A concurrent close is waited out; a concurrent activation is
// joined (ReserveReady once it is Ready). Waits are bounded by act.Deadline.
func (a *InstanceActivationAuthority) Reserve(ctx context.Context, act Activation) (ReserveOutcome, error) {
	req, err := a.buildActivationRequest(act)
	if err != nil {
		return ReserveOutcome{}, err
	}
	rs := a.opts.Relocation
	if rs == nil {
		return ReserveOutcome{}, newError(KindInvalidOperation, "Instance activation requires a Relocation Store.", false, nil)
	}
	ref, err := a.storeEnvelope(ctx, rs, req.envelope)
	if err != nil {
		return ReserveOutcome{}, err
	}
	reserved, err := a.reserveAfterClose(ctx, act, req, ref)
	if err != nil {
		return ReserveOutcome{}, err
	}
	if reserved.Kind != authority.KindReserved {
		return a.reserveLost(ctx, act, req.key, ref, reserved)
	}
	reservation := ActivationReservation{
		Attempt:                  reserved.Creating.ObjectGeneration,
		AuthorityOwnerGeneration: reserved.Creating.AuthorityOwnerGeneration,
		Token:                    reserved.ReservationID,
		OwnershipToken:           reserved.Creating.OwnershipToken,
	}
	a.mu.Lock()
	a.pending[reservation.Token] = &pendingActivation{
		reservationID: reserved.ReservationID, creating: reserved.Creating, owner: req.owner,
		requestReference: ref, requestSHA256: req.sha256[:], requestEncodedSize: int64(len(req.envelope)),
	}
	a.mu.Unlock()
	return ReserveOutcome{Kind: ReserveReserved, Reservation: reservation}, nil
}

// activationRequest is what Reserve builds before touching any store: the
// row's key, the owner it reserves for, the encoded recovery envelope and
// its digest, and the payload of the reserved row.
type activationRequest struct {
	key             authority.Key
	owner           authority.OwnerToken
	envelope        []byte
	sha256          [sha256.Size]byte
	creatingPayload []byte
}

// buildActivationRequest checks that this node holds an owner lease and
// encodes act's recovery envelope (at most 1 MiB) and reserved payload.
func (a *InstanceActivationAuthority) buildActivationRequest(act Activation) (activationRequest, error) {
	target := act.Target
	owner, err := a.requireOwner()
	if err != nil {
		return activationRequest{}, err
	}
	envelope, err := EncodeRecoveryEnvelope(RecoveryEnvelope{TargetMeshName: a.opts.MeshName, Activation: act})
	if err != nil {
		return activationRequest{}, err
	}
	if len(envelope) > authority.MaxPayloadBytes {
		return activationRequest{}, authority.Invalid("Encoded Instance activation request exceeds 1 MiB.")
	}
	key, err := instanceKey(target.TargetSpotID)
	if err != nil {
		return activationRequest{}, err
	}
	creatingPayload, err := EncodeInstancePayload(Payload{
		State: StateColdActivating, StableType: target.StableType, SpotID: target.TargetSpotID,
		OwnerID: owner.OwnerID, OwnerLeaseGeneration: owner.LeaseGeneration,
		OwnerMeshName: a.opts.MeshName, OwnerNodeRID: target.TargetNodeRID, OwnerNodeGeneration: target.TargetNodeGeneration,
	})
	if err != nil {
		return activationRequest{}, err
	}
	return activationRequest{key: key, owner: owner, envelope: envelope, sha256: sha256.Sum256(envelope), creatingPayload: creatingPayload}, nil
}

// storeEnvelope puts the recovery envelope as a new relocation blob and
// reads it back: a receipt that is not an unexpired blob of exactly these
// bytes is KindIntegrity, and the blob is deleted on every failure.
func (a *InstanceActivationAuthority) storeEnvelope(ctx context.Context, rs authority.RelocationStore, envelope []byte) (authority.BlobReference, error) {
	stored, err := rs.PutNew(ctx, envelope, CreationRequestRetention)
	if err != nil {
		return "", failure(ctx, KindRequestFailed, "Relocation Store put failed.", err)
	}
	if stored.Reference == "" {
		return "", newError(KindIntegrity, "Relocation Store returned an invalid creation request receipt.", false, nil)
	}
	storedRead, err := rs.Read(ctx, stored.Reference)
	if err != nil {
		// The receipt could not be checked, not found wrong: the failure is the
		// read's (retryable when it was the deadline).
		a.deleteOrphan(ctx, stored.Reference)
		return "", failure(ctx, KindRequestFailed, "Relocation Store read of the creation request failed.", err)
	}
	if !stored.ExpiresAt.After(stored.StoreNow) ||
		storedRead.Kind != authority.KindFound ||
		CRC32C(storedRead.Bytes) != CRC32C(envelope) || !bytes.Equal(storedRead.Bytes, envelope) {
		a.deleteOrphan(ctx, stored.Reference)
		return "", newError(KindIntegrity, "Relocation Store returned an invalid creation request receipt.", false, err)
	}
	return stored.Reference, nil
}

// reserveAfterClose reserves the row, waiting out a Closing row that holds
// the key and reserving again once it is gone. It returns the first outcome
// that is not such a conflict.
func (a *InstanceActivationAuthority) reserveAfterClose(ctx context.Context, act Activation, req activationRequest, ref authority.BlobReference) (authority.ReserveResult, error) {
	target := act.Target
	for {
		reserved, err := a.opts.Store.Reserve(ctx, authority.ReserveRequest{
			Key: authority.ObjectKey{Kind: authority.ObjectInstanceSpot, GlobalID: target.TargetSpotID},
			Intent: authority.CreationIntent{
				StableType: target.StableType, RequestContentReference: string(ref),
				RequestSHA256: req.sha256[:], RequestEncodedSize: int64(len(req.envelope)),
			},
			Target:          a.creationTarget(target, req.owner),
			CreatingPayload: req.creatingPayload,
			Capacity:        spotCapacity(authority.ObjectInstanceSpot, target.StableType),
		})
		if err != nil {
			// A reservation whose outcome is unknown may have been applied and
			// may publish the envelope: keep the blob (its retention reclaims
			// it if not), since a reserved row without its envelope cannot be
			// recovered.
			if !errors.Is(err, authority.ErrOutcomeUnknown) {
				a.deleteOrphan(ctx, ref)
			}
			return authority.ReserveResult{}, failure(ctx, KindRequestFailed, "Instance activation reservation Store operation failed.", err)
		}
		if !heldByClosingRow(reserved) {
			return reserved, nil
		}
		if err := a.awaitClosingRelease(ctx, req.key, target, act.Deadline); err != nil {
			a.deleteOrphan(ctx, ref)
			return authority.ReserveResult{}, err
		}
	}
}

// heldByClosingRow reports whether a reservation lost to a row in Closing
// state.
func heldByClosingRow(reserved authority.ReserveResult) bool {
	if reserved.Kind != authority.KindConflict && reserved.Kind != authority.KindAlreadyExists {
		return false
	}
	c := reserved.Current
	if c.Kind != authority.KindSnapshot {
		return false
	}
	p, err := DecodeInstancePayload(c.Snapshot.Payload)
	return err == nil && p.State == StateClosing
}

// reserveLost settles a reservation that did not reserve: the envelope is
// deleted; an existing Ready Instance answers ReserveReady, a concurrent
// activation of the same stable type is joined, and anything else is an
// error (KindPlacementCapacityExhausted for exhausted capacity).
func (a *InstanceActivationAuthority) reserveLost(ctx context.Context, act Activation, key authority.Key, ref authority.BlobReference, reserved authority.ReserveResult) (ReserveOutcome, error) {
	target := act.Target
	if reserved.Kind == authority.KindAlreadyExists {
		a.claimConflict(target.StableType, "already_exists")
		a.deleteOrphan(ctx, ref)
		route, err := readyExisting(reserved.Current.Snapshot, target)
		if err != nil {
			return ReserveOutcome{}, err
		}
		return ReserveOutcome{Kind: ReserveReady, Route: route}, nil
	}
	if c := reserved.Current; reserved.Kind == authority.KindConflict && c.Kind == authority.KindSnapshot &&
		c.Snapshot.Allocation.ObjectKind == authority.ObjectInstanceSpot &&
		c.Snapshot.Allocation.StableType == target.StableType &&
		c.Snapshot.Allocation.State == authority.AllocationReserved {
		a.claimConflict(target.StableType, "activation_in_progress")
		a.deleteOrphan(ctx, ref)
		route, err := a.awaitConcurrentActivation(ctx, key, target, act.Deadline)
		if err != nil {
			return ReserveOutcome{}, err
		}
		return ReserveOutcome{Kind: ReserveReady, Route: route}, nil
	}
	a.claimConflict(target.StableType, string(reserved.Kind))
	a.deleteOrphan(ctx, ref)
	if reserved.Kind == authority.KindPlacementCapacityExhausted {
		return ReserveOutcome{}, newError(KindPlacementCapacityExhausted,
			fmt.Sprintf("Instance Spot placement capacity is exhausted for '%s'.", target.TargetSpotID), false, nil)
	}
	return ReserveOutcome{}, newError(KindRequestFailed, fmt.Sprintf("Instance activation reservation failed: %s.", reserved.Kind), false, nil)
}

// awaitConcurrentActivation waits until the concurrent activation of target
// is Ready.
func (a *InstanceActivationAuthority) awaitConcurrentActivation(ctx context.Context, key authority.Key, target ActivationTarget, deadline time.Time) (RouteFence, error) {
	var route RouteFence
	settled, err := a.awaitInstance(ctx, key, deadline, func(cur authority.ReadResult) (bool, error) {
		if cur.Kind != authority.KindSnapshot {
			return true, newError(KindSpotMoving, "Concurrent Instance activation ended before the Ready barrier.", true, nil)
		}
		if cur.Snapshot.Allocation.ObjectKind != authority.ObjectInstanceSpot || cur.Snapshot.Allocation.StableType != target.StableType {
			return true, newError(KindSpotTypeMismatch, "Concurrent Instance activation resolved to a different Spot type.", false, nil)
		}
		if cur.Snapshot.Allocation.State != authority.AllocationActive {
			return false, nil
		}
		var err error
		route, err = readyExisting(cur.Snapshot, target)
		return true, err
	})
	if err != nil {
		return RouteFence{}, err
	}
	if !settled {
		return RouteFence{}, newError(KindDeadlineExceeded,
			fmt.Sprintf("Concurrent Instance activation for '%s' did not reach Ready before deadline.", target.TargetSpotID), true, nil)
	}
	return route, nil
}

// awaitClosingRelease waits until the Instance row of target is no longer
// closing.
func (a *InstanceActivationAuthority) awaitClosingRelease(ctx context.Context, key authority.Key, target ActivationTarget, deadline time.Time) error {
	settled, err := a.awaitInstance(ctx, key, deadline, func(cur authority.ReadResult) (bool, error) {
		if cur.Kind != authority.KindSnapshot {
			return true, nil
		}
		p, derr := DecodeInstancePayload(cur.Snapshot.Payload)
		if cur.Snapshot.Allocation.ObjectKind != authority.ObjectInstanceSpot ||
			cur.Snapshot.Allocation.StableType != target.StableType ||
			derr != nil || p.SpotID != target.TargetSpotID {
			return true, newError(KindSpotTypeMismatch, "Instance authority changed to a different Spot while closing.", false, nil)
		}
		return p.State != StateClosing, nil
	})
	if err != nil {
		return err
	}
	if !settled {
		return newError(KindDeadlineExceeded,
			fmt.Sprintf("Instance Spot '%s' close did not release authority before deadline.", target.TargetSpotID), true, nil)
	}
	return nil
}

// awaitInstance reads the Instance row at key until settle says it is
// settled (or fails), waiting between reads for the row to change (on the
// store's change feed when it has one, else polling). It reports false when
// deadline passed first; ctx ending is its own error.
func (a *InstanceActivationAuthority) awaitInstance(ctx context.Context, key authority.Key, deadline time.Time, settle func(authority.ReadResult) (bool, error)) (bool, error) {
	wctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	for {
		cur, err := a.rows().ReadAuthority(wctx, key)
		if err != nil {
			if wctx.Err() != nil && ctx.Err() == nil {
				return false, nil
			}
			// the caller's ctx classifies it (wctx's own deadline is the case above)
			return false, failure(ctx, KindRequestFailed, readFailed(authority.ObjectInstanceSpot), err)
		}
		if done, err := settle(cur); done || err != nil {
			return true, err
		}
		if err := waitForChange(wctx, a.opts.Store, key, seenVersion(cur), a.opts.PollInterval); err != nil {
			if ctx.Err() != nil {
				return false, asDeadline(ctx.Err(), opInstanceActivation)
			}
			return false, nil
		}
	}
}

// Abort abandons a reservation this authority holds and deletes its recovery
// envelope blob. Aborting a reservation it does not hold does nothing.
func (a *InstanceActivationAuthority) Abort(ctx context.Context, target ActivationTarget, reservation ActivationReservation) error {
	a.mu.Lock()
	p := a.pending[reservation.Token]
	a.mu.Unlock()
	if p == nil {
		return nil
	}
	res, err := a.opts.Store.Abort(ctx, authority.AbortRequest{
		Key:           authority.ObjectKey{Kind: authority.ObjectInstanceSpot, GlobalID: target.TargetSpotID},
		ReservationID: p.reservationID, ExpectedStoreVersion: p.creating.StoreVersion,
		Target: a.creationTarget(target, p.owner),
	})
	if err != nil {
		return failure(ctx, KindRequestFailed, "Instance activation abort Store operation failed.", err)
	}
	if res.Kind != authority.KindAborted && res.Kind != authority.KindAlreadyAborted {
		return newError(KindRequestFailed, fmt.Sprintf("Instance activation abort failed: %s.", res.Kind), false, nil)
	}
	a.dropPending(reservation.Token)
	a.deleteOrphan(ctx, p.requestReference)
	return nil
}
