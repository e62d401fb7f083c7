package coordinator

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"time"

	authority "github.com/zlink-systems/authority"
)

// RemoteReservation is the reservation fence a remote creation carries: the
// exact reserved row the target must find.
type RemoteReservation struct {
	ReservationID              string
	ExpectedStoreVersion       authority.StoreVersion
	ObjectGeneration           int64
	AuthorityOwnerGeneration   int64
	TargetNodeRID              string
	TargetNodeGeneration       int64
	TargetOwnerID              string
	TargetOwnerLeaseGeneration int64
	PendingCapacityDelta       int64
}

// RemoteCreate asks a target node to materialize a User Spot reserved there.
type RemoteCreate struct {
	SourceNodeRID        string
	SourceNodeGeneration int64
	SpotID               string
	StableType           string
	Reservation          RemoteReservation
	// Deadline is the creation's end-to-end deadline.
	Deadline time.Time
}

// fingerprint is the immutable content of a remote creation: deliveries of
// one reservation must agree on it.
type fingerprint struct {
	spotID      string
	stableType  string
	reservation RemoteReservation
}

func (r *RemoteCreate) fingerprint() fingerprint {
	return fingerprint{spotID: r.SpotID, stableType: r.StableType, reservation: r.Reservation}
}

// RemoteReply is a target's answer to a RemoteCreate.
type RemoteReply struct {
	ObjectGeneration int64
	State            CreateState
	Reply            []byte
}

// Transport carries remote creations to their target node, where the
// receiving side calls UserSpotCoordinator.HandleRemoteCreate. A failure the
// target reported as a *Error should be returned as one.
type Transport interface {
	RemoteCreate(ctx context.Context, meshName, nodeRID string, req RemoteCreate) (RemoteReply, error)
}

// TransportFunc adapts a function to Transport.
type TransportFunc func(ctx context.Context, meshName, nodeRID string, req RemoteCreate) (RemoteReply, error)

// RemoteCreate calls f.
func (f TransportFunc) RemoteCreate(ctx context.Context, meshName, nodeRID string, req RemoteCreate) (RemoteReply, error) {
	return f(ctx, meshName, nodeRID, req)
}

// Reply returns the RemoteReply a transport sends back for res.
func (res CreateResult) RemoteReply() RemoteReply {
	return RemoteReply{ObjectGeneration: res.Spot.ObjectGeneration, State: res.State, Reply: res.Reply}
}

// HandleRemoteCreate materializes, on this node, a User Spot a remote creator
// reserved here. Deliveries of one reservation are de-duplicated: while one is
// in flight the others share its outcome, and a delivery after the Spot is
// Ready answers Existing without running materialize again. A delivery that
// reuses the reservation with other content is KindRequestFailed.
func (c *UserSpotCoordinator) HandleRemoteCreate(ctx context.Context, req RemoteCreate, materialize RemoteMaterializeFunc, discard DiscardFunc) (CreateResult, error) {
	if materialize == nil {
		return CreateResult{}, authority.Invalid("Remote User Spot creation requires a materialize function.")
	}
	key := req.SpotID + "\x00" + req.Reservation.ReservationID
	fp := req.fingerprint()
	c.mu.Lock()
	a := c.remote[key]
	if a != nil && a.fingerprint != fp {
		c.mu.Unlock()
		return CreateResult{}, newError(KindRequestFailed, "Remote User Spot reservation was reused with different immutable content.", false, nil)
	}
	first := a == nil
	if first {
		a = &admission{fingerprint: fp, done: make(chan struct{})}
		c.remote[key] = a
	}
	c.mu.Unlock()
	if first {
		c.run(ctx, c.remote, key, a, req, materialize, discard)
	}
	return a.wait(ctx)
}

// handleLocalCreate runs a local creation, de-duplicated by reservation ID.
func (c *UserSpotCoordinator) handleLocalCreate(ctx context.Context, req RemoteCreate, materialize RemoteMaterializeFunc, discard DiscardFunc) (CreateResult, error) {
	key := req.Reservation.ReservationID
	c.mu.Lock()
	a := c.local[key]
	first := a == nil
	if first {
		a = &admission{fingerprint: req.fingerprint(), done: make(chan struct{})}
		c.local[key] = a
	}
	c.mu.Unlock()
	if first {
		c.run(ctx, c.local, key, a, req, materialize, discard)
	}
	return a.wait(ctx)
}

// run performs the admitted creation and releases its admission.
func (c *UserSpotCoordinator) run(ctx context.Context, table map[string]*admission, key string, a *admission, req RemoteCreate, materialize RemoteMaterializeFunc, discard DiscardFunc) {
	a.result, a.err = c.materializeRemoteCreate(ctx, req, materialize, discard)
	c.mu.Lock()
	if table[key] == a {
		delete(table, key)
	}
	c.mu.Unlock()
	close(a.done)
}

// exactIdentity reports whether s is the row req reserved.
func exactIdentity(s *authority.Snapshot, req *RemoteCreate) bool {
	r := req.Reservation
	a := s.Allocation
	return a.ObjectKind == authority.ObjectUserSpot &&
		a.StableType == req.StableType &&
		s.ObjectGeneration == r.ObjectGeneration &&
		s.AuthorityOwnerGeneration == r.AuthorityOwnerGeneration &&
		a.Descriptor.RID == r.TargetNodeRID &&
		a.DescriptorLifecycleGeneration == r.TargetNodeGeneration &&
		s.OwnerID == r.TargetOwnerID &&
		s.OwnerLeaseGeneration == r.TargetOwnerLeaseGeneration &&
		a.Capacity.Actors == 0 &&
		a.Capacity.Spots == r.PendingCapacityDelta &&
		a.Capacity.SpotType != nil &&
		a.Capacity.SpotType.ObjectKind == authority.ObjectUserSpot &&
		a.Capacity.SpotType.StableType == req.StableType &&
		a.Capacity.SpotType.Count == r.PendingCapacityDelta
}

func (c *UserSpotCoordinator) materializeRemoteCreate(ctx context.Context, req RemoteCreate, materialize RemoteMaterializeFunc, discard DiscardFunc) (CreateResult, error) {
	key, err := authority.EncodeKey(authority.ObjectUserSpot, req.SpotID)
	if err != nil {
		return CreateResult{}, err
	}
	read, err := c.opts.Store.ReadAuthority(ctx, key)
	if err != nil {
		return CreateResult{}, failure(ctx, KindRequestFailed, "User Spot authority read failed.", err)
	}
	if read.Kind != authority.KindSnapshot || !exactIdentity(read.Snapshot, &req) {
		return CreateResult{}, newError(KindSpotMoving, "Remote User Spot reservation fence is stale.", false, nil)
	}
	current := read.Snapshot
	spot := refOf(current, req.SpotID)
	if current.Allocation.State == authority.AllocationActive {
		// A target restart loses the process-local command terminal, but Ready
		// authority proves the exact reservation generation committed.
		return CreateResult{Spot: spot, State: Existing}, nil
	}
	if current.StoreVersion != req.Reservation.ExpectedStoreVersion {
		return CreateResult{}, newError(KindSpotMoving, "Remote User Spot Pending StoreVersion is stale.", false, nil)
	}
	pending := current.PendingCreation
	if pending == nil || pending.ReservationID != req.Reservation.ReservationID {
		return CreateResult{}, newError(KindRequestFailed, "Remote User Spot Pending creation projection is missing.", false, nil)
	}
	payload, err := DecodeContentReference(pending.RequestContentReference, NoContentCheck)
	if err != nil {
		return CreateResult{}, failure(ctx, KindRequestFailed, "User Spot creation content reference is invalid.", err)
	}
	sum := sha256.Sum256(payload)
	if int64(len(payload)) != pending.RequestEncodedSize || !bytes.Equal(sum[:], pending.RequestSHA256) {
		return CreateResult{}, newError(KindIntegrity, "Remote User Spot Pending creation content failed integrity validation.", false, nil)
	}
	target := authority.CreationTarget{
		MeshName: current.Allocation.Descriptor.MeshName, NodeRID: current.Allocation.Descriptor.RID,
		NodeLifecycleGeneration: current.Allocation.DescriptorLifecycleGeneration, Owner: current.Owner(),
	}
	abortReq := authority.AbortRequest{
		Key:           authority.ObjectKey{Kind: authority.ObjectUserSpot, GlobalID: req.SpotID},
		ReservationID: pending.ReservationID, ExpectedStoreVersion: current.StoreVersion, Target: target,
	}

	local, err := c.materializeAndCommit(ctx, req, materialize, discard, payload, current, target, abortReq)
	if err == nil {
		return local.CreateResult, nil
	}
	if local.pub != nil {
		local.pub.Abort()
	}
	if cleanup := c.rollback(ctx, abortReq, discard); len(cleanup) > 0 {
		return CreateResult{}, &RollbackError{Err: err, Cleanup: cleanup}
	}
	return CreateResult{}, err
}

// createOutcome is a CreateResult plus the publication to abort on failure.
type createOutcome = struct {
	CreateResult
	pub Publication
}

func (c *UserSpotCoordinator) materializeAndCommit(ctx context.Context, req RemoteCreate, materialize RemoteMaterializeFunc, discard DiscardFunc,
	payload []byte, current *authority.Snapshot, target authority.CreationTarget, abortReq authority.AbortRequest,
) (createOutcome, error) {
	spot := refOf(current, req.SpotID)
	local, err := materialize(ctx, payload, current)
	if err != nil {
		return createOutcome{}, err
	}
	out := createOutcome{pub: local.Publication}
	if local.State == Rejected {
		if local.Publication != nil {
			local.Publication.Abort()
			out.pub = nil
		}
		if _, err := c.opts.Store.Abort(ctx, abortReq); err != nil {
			return out, failure(ctx, KindRequestFailed, "User Spot abort Store operation failed.", err)
		}
		if discard != nil {
			if err := discard(ctx); err != nil {
				return out, err
			}
		}
		out.CreateResult = CreateResult{Spot: spot, State: local.State, Reply: local.Reply}
		return out, nil
	}
	ready, err := EncodeUserSpotPayload(Payload{
		State: StateReady, StableType: req.StableType, SpotID: req.SpotID,
		OwnerID: current.OwnerID, OwnerLeaseGeneration: current.OwnerLeaseGeneration,
		OwnerMeshName: target.MeshName, OwnerNodeRID: target.NodeRID, OwnerNodeGeneration: target.NodeLifecycleGeneration,
	})
	if err != nil {
		return out, err
	}
	committed, err := c.opts.Store.Commit(ctx, authority.CommitRequest{
		Key:           abortReq.Key,
		ReservationID: abortReq.ReservationID, ExpectedStoreVersion: current.StoreVersion,
		Target: target, ReadyPayload: ready,
	})
	if err != nil {
		return out, failure(ctx, KindRequestFailed, "User Spot Ready commit Store operation failed.", err)
	}
	if committed.Kind != authority.KindCommitted && committed.Kind != authority.KindAlreadyCommitted {
		return out, newError(KindRequestFailed, fmt.Sprintf("Remote User Spot Ready commit failed: %s.", committed.Kind), false, nil)
	}
	spot.ObjectGeneration = committed.Ready.ObjectGeneration
	c.publishReadyRoute(req.SpotID, committed.Ready)
	if local.Publication != nil {
		local.Publication.Publish()
	}
	out.CreateResult = CreateResult{Spot: spot, State: local.State, Reply: local.Reply}
	return out, nil
}

// rollback aborts the reservation and discards the materialized object
// concurrently, each bounded by the cleanup timeout (which is not bounded by
// ctx: the creation's own deadline may be what failed it). It returns the
// cleanup failures.
func (c *UserSpotCoordinator) rollback(ctx context.Context, abortReq authority.AbortRequest, discard DiscardFunc) []error {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.CleanupTimeout)
	defer cancel()
	results := make(chan error, 2)
	go func() {
		_, err := c.opts.Store.Abort(cctx, abortReq)
		results <- err
	}()
	go func() {
		if discard == nil {
			results <- nil
			return
		}
		results <- discard(cctx)
	}()
	var errs []error
	for range 2 {
		select {
		case err := <-results:
			if err != nil {
				errs = append(errs, err)
			}
		case <-cctx.Done():
			// The seed stops waiting when the cleanup deadline passes.
			select {
			case err := <-results:
				if err != nil {
					errs = append(errs, err)
				}
			default:
				errs = append(errs, fmt.Errorf("User Spot creation cleanup timed out: %w", cctx.Err()))
			}
		}
	}
	return errs
}

// remoteCreate asks the target node, through the Transport, to materialize
// the Spot reserved there.
func (c *UserSpotCoordinator) remoteCreate(ctx context.Context, req CreateRequest, s *authority.Snapshot, target Target, deadline time.Time) (CreateResult, error) {
	if c.opts.Transport == nil || s.PendingCreation == nil {
		return CreateResult{}, newError(KindRequestFailed, "Remote User Spot creation transport is not configured.", false, nil)
	}
	if time.Until(deadline) <= 0 {
		return CreateResult{}, newError(KindDeadlineExceeded, "Remote User Spot creation exhausted its end-to-end deadline.", true, nil)
	}
	mesh := s.Allocation.Descriptor.MeshName
	reply, err := c.opts.Transport.RemoteCreate(ctx, mesh, target.NodeRID, RemoteCreate{
		SourceNodeRID:        c.opts.NodeRID,
		SourceNodeGeneration: c.opts.NodeGeneration,
		SpotID:               req.SpotID,
		StableType:           req.StableType,
		Reservation:          reservationOf(s, target.NodeRID, target.NodeGeneration),
		Deadline:             deadline,
	})
	if err != nil {
		var e *Error
		var r *RollbackError
		if errors.As(err, &e) || errors.As(err, &r) {
			return CreateResult{}, err
		}
		return CreateResult{}, failure(ctx, KindRequestFailed, "Remote User Spot creation failed.", err)
	}
	state := Rejected
	switch reply.State {
	case Existing, Created:
		state = reply.State
	}
	spot := SpotRef{SpotID: req.SpotID, ObjectGeneration: reply.ObjectGeneration, MeshName: mesh, NodeRID: target.NodeRID}
	return CreateResult{Spot: spot, State: state, Reply: reply.Reply}, nil
}
