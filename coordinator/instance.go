package coordinator

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"time"

	authority "github.com/zlink-systems/authority"
)

// CreationRequestRetention is how long an activation's recovery envelope
// blob is kept (24 hours).
const CreationRequestRetention = 24 * time.Hour

// orphanDeleteTimeout bounds the best-effort delete of an unpublished blob.
const orphanDeleteTimeout = time.Second

// RouteFence is the route of a Ready Instance Spot generation.
type RouteFence struct {
	TargetNodeRID            string
	TargetNodeGeneration     int64
	TargetSpotID             string
	ObjectGeneration         int64
	OwnerID                  string
	AuthorityOwnerGeneration int64
	LeaseGeneration          int64
	StoreVersion             authority.StoreVersion
	// OwnershipToken is the Ready row's fencing token
	// (authority.Snapshot.OwnershipToken): the activated Spot's code sends
	// it with its writes to other systems (package fencing).
	OwnershipToken int64
}

// ReadKind is the outcome of InstanceActivationAuthority.Read.
type ReadKind string

// Read outcomes.
const (
	ReadMissing  ReadKind = "missing"
	ReadCreating ReadKind = "creating"
	ReadReady    ReadKind = "ready"
)

// AuthorityRead is what Read found.
type AuthorityRead struct {
	Kind ReadKind
	// ObjectGeneration and AuthorityOwnerGeneration are set for ReadCreating.
	ObjectGeneration         int64
	AuthorityOwnerGeneration int64
	// Route is set for ReadReady.
	Route RouteFence
}

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

// InstanceOptions configures an InstanceActivationAuthority.
type InstanceOptions struct {
	// Store is the authority store. Required.
	Store CreationStore
	// Reader answers the authority's row reads (nil: Store), for example a
	// local read view of the Instance Spot rows (package view).
	Reader RowReader
	// Relocation stores recovery envelopes. Required for Reserve.
	Relocation authority.RelocationStore
	// MeshName is this node's mesh. Required.
	MeshName string
	// Owner returns this node's current owner lease; ok false while it has
	// none. Required for Reserve.
	Owner func() (owner authority.OwnerToken, ok bool)
	// OnReady is called when an activation this authority committed is Ready.
	OnReady func(target ActivationTarget, route RouteFence)
	// OnClaimConflict is called when a reservation loses to an existing row
	// (reason "already_exists", "activation_in_progress" or the store's
	// outcome kind), for a claim-conflict metric.
	OnClaimConflict func(meshName, stableType, reason string)
	// PollInterval is the wait between reads while joining a concurrent
	// activation or waiting out a close, when the store has no change feed
	// (default 10ms).
	PollInterval time.Duration
}

// InstanceActivationAuthority activates Instance Spots through the authority
// store. It is safe for
// concurrent use. The reservations it holds live in memory; after a restart
// a new authority takes them over with Resume.
type InstanceActivationAuthority struct {
	opts InstanceOptions

	mu      sync.Mutex
	pending map[string]*pendingActivation
}

type pendingActivation struct {
	reservationID      string
	creating           *authority.Snapshot
	owner              authority.OwnerToken
	requestReference   authority.BlobReference
	requestSHA256      []byte
	requestEncodedSize int64
}

// NewInstanceActivationAuthority returns an authority over opts.Store.
func NewInstanceActivationAuthority(opts InstanceOptions) (*InstanceActivationAuthority, error) {
	if opts.Store == nil {
		return nil, authority.Invalid("Instance activation authority requires a store.")
	}
	if err := authority.RequireText(opts.MeshName, "mesh name"); err != nil {
		return nil, err
	}
	if opts.PollInterval <= 0 {
		opts.PollInterval = defaultPollInterval
	}
	return &InstanceActivationAuthority{opts: opts, pending: map[string]*pendingActivation{}}, nil
}

func instanceKey(spotID string) (authority.Key, error) {
	return authority.EncodeKey(authority.ObjectInstanceSpot, spotID)
}

// Read reports whether the target is Ready, being activated on the target
// node, or missing (anything else reads as missing).
func (a *InstanceActivationAuthority) Read(ctx context.Context, target ActivationTarget) (AuthorityRead, error) {
	key, err := instanceKey(target.TargetSpotID)
	if err != nil {
		return AuthorityRead{}, err
	}
	cur, err := a.read(ctx, key)
	if err != nil {
		return AuthorityRead{}, failure(ctx, KindRequestFailed, "Instance authority read failed.", err)
	}
	if cur.Kind != authority.KindSnapshot {
		return AuthorityRead{Kind: ReadMissing}, nil
	}
	return readyRead(cur.Snapshot, target), nil
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
			Target: authority.CreationTarget{
				MeshName: a.opts.MeshName, NodeRID: target.TargetNodeRID,
				NodeLifecycleGeneration: target.TargetNodeGeneration, Owner: req.owner,
			},
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

// Resume takes over, after a restart, the reserved activation whose pending
// projection is pending. The row must still be exactly that reservation
// (else KindSpotGenerationStale).
func (a *InstanceActivationAuthority) Resume(ctx context.Context, target ActivationTarget, pending PendingActivation) (ActivationReservation, error) {
	key, err := instanceKey(target.TargetSpotID)
	if err != nil {
		return ActivationReservation{}, err
	}
	cur, err := a.read(ctx, key)
	if err != nil {
		return ActivationReservation{}, failure(ctx, KindRequestFailed, "Instance authority read failed.", err)
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
		Target: authority.CreationTarget{
			MeshName: a.opts.MeshName, NodeRID: target.TargetNodeRID,
			NodeLifecycleGeneration: target.TargetNodeGeneration, Owner: p.owner,
		},
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
	key, err := instanceKey(target.TargetSpotID)
	if err != nil {
		return CommitOutcome{}, err
	}
	cur, err := a.read(ctx, key)
	if err != nil {
		return CommitOutcome{}, failure(ctx, KindRequestFailed, "Instance authority read failed.", err)
	}
	if cur.Kind == authority.KindSnapshot {
		if r := readyRead(cur.Snapshot, target); r.Kind == ReadReady {
			a.dropPending(reservation.Token)
			return CommitOutcome{Kind: CommitLost, Route: r.Route}, nil
		}
	}
	return CommitOutcome{}, newError(KindRequestFailed, fmt.Sprintf("Instance activation commit failed: %s.", res.Kind), false, nil)
}

// Complete finishes a committed activation: it durably records the replay
// cursor at the inbox sequence, then releases the inbox (drops the recovery
// record from the payload), then deletes the recovery envelope blob. Each
// step is fenced on the row's version, so a retried Complete resumes where a
// failed one stopped.
func (a *InstanceActivationAuthority) Complete(ctx context.Context, target ActivationTarget, route RouteFence) (RouteFence, error) {
	key, err := instanceKey(target.TargetSpotID)
	if err != nil {
		return RouteFence{}, err
	}
	read, err := a.read(ctx, key)
	if err != nil {
		return RouteFence{}, failure(ctx, KindRequestFailed, "Instance authority read failed.", err)
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
	completed := current
	if recovery.ReplayCursor < recovery.InboxSequence {
		next := decoded
		rec := *recovery
		rec.ReplayCursor = rec.InboxSequence
		next.ActivationRecovery = &rec
		payload, err := EncodePayload(next)
		if err != nil {
			return RouteFence{}, err
		}
		res, err := a.opts.Store.CompareExchangeAuthority(ctx, key, current.StoreVersion, authority.Put(payload))
		if err != nil {
			return RouteFence{}, failure(ctx, KindRequestFailed, "Instance activation terminal completion Store operation failed.", err)
		}
		if res.Kind != authority.KindStored {
			return RouteFence{}, newError(KindRequestFailed, fmt.Sprintf("Instance activation terminal completion record failed: %s.", res.Kind), false, nil)
		}
		completed = res.Snapshot
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
		Target: authority.CreationTarget{
			MeshName: a.opts.MeshName, NodeRID: target.TargetNodeRID,
			NodeLifecycleGeneration: target.TargetNodeGeneration, Owner: p.owner,
		},
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

func (a *InstanceActivationAuthority) requireOwner() (authority.OwnerToken, error) {
	if a.opts.Owner != nil {
		if owner, ok := a.opts.Owner(); ok {
			return owner, nil
		}
	}
	return authority.OwnerToken{}, newError(KindInvalidOperation, "Location owner lease is not ready.", true, nil)
}

func (a *InstanceActivationAuthority) requirePending(r ActivationReservation) (*pendingActivation, error) {
	a.mu.Lock()
	p := a.pending[r.Token]
	a.mu.Unlock()
	if p == nil || p.creating.ObjectGeneration != r.Attempt {
		return nil, newError(KindSpotGenerationStale, "Instance activation reservation is stale.", false, nil)
	}
	return p, nil
}

func (a *InstanceActivationAuthority) dropPending(token string) {
	a.mu.Lock()
	delete(a.pending, token)
	a.mu.Unlock()
}

func (a *InstanceActivationAuthority) claimConflict(stableType, reason string) {
	if a.opts.OnClaimConflict != nil {
		a.opts.OnClaimConflict(a.opts.MeshName, stableType, reason)
	}
}

// deleteOrphan deletes a blob no authority row publishes, best effort: when
// it fails, the blob's retention cleans it up. It runs even when ctx ended.
func (a *InstanceActivationAuthority) deleteOrphan(ctx context.Context, ref authority.BlobReference) {
	if a.opts.Relocation == nil || ref == "" {
		return
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), orphanDeleteTimeout)
	defer cancel()
	_ = a.opts.Relocation.Delete(dctx, ref)
}

// awaitConcurrentActivation waits until the concurrent activation of target
// is Ready.
func (a *InstanceActivationAuthority) awaitConcurrentActivation(ctx context.Context, key authority.Key, target ActivationTarget, deadline time.Time) (RouteFence, error) {
	wctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	for {
		cur, err := a.read(wctx, key)
		if err != nil {
			if wctx.Err() != nil && ctx.Err() == nil {
				break
			}
			return RouteFence{}, failure(ctx, KindRequestFailed, "Instance authority read failed.", err)
		}
		if cur.Kind != authority.KindSnapshot {
			return RouteFence{}, newError(KindSpotMoving, "Concurrent Instance activation ended before the Ready barrier.", true, nil)
		}
		if cur.Snapshot.Allocation.ObjectKind != authority.ObjectInstanceSpot || cur.Snapshot.Allocation.StableType != target.StableType {
			return RouteFence{}, newError(KindSpotTypeMismatch, "Concurrent Instance activation resolved to a different Spot type.", false, nil)
		}
		if cur.Snapshot.Allocation.State == authority.AllocationActive {
			return readyExisting(cur.Snapshot, target)
		}
		if err := waitForChange(wctx, a.opts.Store, key, seenVersion(cur), a.opts.PollInterval); err != nil {
			if ctx.Err() != nil {
				return RouteFence{}, asDeadline(ctx.Err(), opInstanceActivation)
			}
			break
		}
	}
	return RouteFence{}, newError(KindDeadlineExceeded,
		fmt.Sprintf("Concurrent Instance activation for '%s' did not reach Ready before deadline.", target.TargetSpotID), true, nil)
}

// awaitClosingRelease waits until the Instance row of target is no longer
// closing.
func (a *InstanceActivationAuthority) awaitClosingRelease(ctx context.Context, key authority.Key, target ActivationTarget, deadline time.Time) error {
	wctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	for {
		cur, err := a.read(wctx, key)
		if err != nil {
			if wctx.Err() != nil && ctx.Err() == nil {
				break
			}
			return failure(ctx, KindRequestFailed, "Instance authority read failed.", err)
		}
		if cur.Kind != authority.KindSnapshot {
			return nil
		}
		p, derr := DecodeInstancePayload(cur.Snapshot.Payload)
		if cur.Snapshot.Allocation.ObjectKind != authority.ObjectInstanceSpot ||
			cur.Snapshot.Allocation.StableType != target.StableType ||
			derr != nil || p.SpotID != target.TargetSpotID {
			return newError(KindSpotTypeMismatch, "Instance authority changed to a different Spot while closing.", false, nil)
		}
		if p.State != StateClosing {
			return nil
		}
		if err := waitForChange(wctx, a.opts.Store, key, seenVersion(cur), a.opts.PollInterval); err != nil {
			if ctx.Err() != nil {
				return asDeadline(ctx.Err(), opInstanceActivation)
			}
			break
		}
	}
	return newError(KindDeadlineExceeded,
		fmt.Sprintf("Instance Spot '%s' close did not release authority before deadline.", target.TargetSpotID), true, nil)
}

// readyRead classifies an Instance row for Read.
func readyRead(s *authority.Snapshot, target ActivationTarget) AuthorityRead {
	alloc := s.Allocation
	if p, err := DecodeInstancePayload(s.Payload); err == nil && p.State == StateColdActivating &&
		alloc.ObjectKind == authority.ObjectInstanceSpot &&
		alloc.State == authority.AllocationReserved &&
		p.StableType == target.StableType && p.SpotID == target.TargetSpotID &&
		p.OwnerID == s.OwnerID && p.OwnerLeaseGeneration == s.OwnerLeaseGeneration &&
		p.OwnerMeshName == alloc.Descriptor.MeshName &&
		p.OwnerNodeGeneration == alloc.DescriptorLifecycleGeneration &&
		p.OwnerNodeRID == alloc.Descriptor.RID &&
		target.TargetNodeRID == alloc.Descriptor.RID &&
		target.TargetNodeGeneration == alloc.DescriptorLifecycleGeneration {
		return AuthorityRead{Kind: ReadCreating, ObjectGeneration: s.ObjectGeneration, AuthorityOwnerGeneration: s.AuthorityOwnerGeneration}
	}
	if !matchingReady(s, target) ||
		target.TargetNodeRID != alloc.Descriptor.RID ||
		target.TargetNodeGeneration != alloc.DescriptorLifecycleGeneration {
		return AuthorityRead{Kind: ReadMissing}
	}
	route, err := routeFromSnapshot(s)
	if err != nil {
		return AuthorityRead{Kind: ReadMissing}
	}
	return AuthorityRead{Kind: ReadReady, Route: route}
}

// matchingReady reports whether s is the active Ready row of target's Spot,
// its payload agreeing with the row's owner and node.
func matchingReady(s *authority.Snapshot, target ActivationTarget) bool {
	p, ok := DecodeReadySpot(s.Payload)
	alloc := s.Allocation
	return ok && p.Kind == authority.ObjectInstanceSpot &&
		p.StableType == target.StableType && p.SpotID == target.TargetSpotID &&
		alloc.ObjectKind == authority.ObjectInstanceSpot && alloc.State == authority.AllocationActive &&
		p.OwnerID == s.OwnerID && p.OwnerLeaseGeneration == s.OwnerLeaseGeneration &&
		p.OwnerMeshName == alloc.Descriptor.MeshName &&
		p.OwnerNodeGeneration == alloc.DescriptorLifecycleGeneration &&
		p.OwnerNodeRID == alloc.Descriptor.RID
}

func readyExisting(s *authority.Snapshot, target ActivationTarget) (RouteFence, error) {
	if s == nil || !matchingReady(s, target) {
		return RouteFence{}, newError(KindRequestFailed, "Existing Instance authority is not a matching Ready allocation.", false, nil)
	}
	return routeFromSnapshot(s)
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

func routeFromSnapshot(s *authority.Snapshot) (RouteFence, error) {
	p, ok := DecodeReadySpot(s.Payload)
	if !ok || p.Kind != authority.ObjectInstanceSpot {
		return RouteFence{}, newError(KindRequestFailed, "Instance authority is not Ready.", false, nil)
	}
	return RouteFence{
		TargetNodeRID: s.Allocation.Descriptor.RID, TargetNodeGeneration: s.Allocation.DescriptorLifecycleGeneration,
		TargetSpotID: p.SpotID, ObjectGeneration: s.ObjectGeneration, OwnerID: s.OwnerID,
		AuthorityOwnerGeneration: s.AuthorityOwnerGeneration, LeaseGeneration: s.OwnerLeaseGeneration,
		StoreVersion: s.StoreVersion, OwnershipToken: s.OwnershipToken,
	}, nil
}
