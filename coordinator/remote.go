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
		c.run(ctx, false, key, a, req, materialize, discard)
	}
	return a.wait(ctx)
}

// handleLocalCreate runs a local creation, de-duplicated by reservation ID.
// registered is called once the admission is in c.local (the caller leaves
// the Spot's gate there).
func (c *UserSpotCoordinator) handleLocalCreate(ctx context.Context, req RemoteCreate, materialize RemoteMaterializeFunc, discard DiscardFunc, registered func()) (CreateResult, error) {
	key := req.Reservation.ReservationID
	c.mu.Lock()
	a := c.local[key]
	first := a == nil
	if first {
		a = &admission{fingerprint: req.fingerprint(), done: make(chan struct{})}
		c.local[key] = a
	}
	c.mu.Unlock()
	registered()
	if first {
		c.run(ctx, true, key, a, req, materialize, discard)
	}
	return a.wait(ctx)
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
	_, read, err := readSpot(ctx, c.rows(), authority.ObjectUserSpot, req.SpotID)
	if err != nil {
		return CreateResult{}, err
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

	var out createOutcome
	returned := false
	defer func() {
		if returned {
			return
		}
		// materialize, a hook or a publication panicked: roll back as for a
		// returned error, then let the panic go on (a second panic in
		// the cleanup must not replace it).
		if out.pub != nil {
			_ = catchPanic("publication abort", func() error { out.pub.Abort(); return nil })
		}
		c.rollback(ctx, abortReq, discard, out.commitUnknown)
	}()
	err = c.materializeAndCommit(ctx, req, materialize, discard, payload, current, target, abortReq, &out)
	returned = true
	if err == nil {
		return out.CreateResult, nil
	}
	if out.pub != nil {
		out.pub.Abort()
	}
	if cleanup := c.rollback(ctx, abortReq, discard, out.commitUnknown); len(cleanup) > 0 {
		return CreateResult{}, &RollbackError{Err: err, Cleanup: cleanup}
	}
	return CreateResult{}, err
}

// createOutcome is what materializeAndCommit got to: its result, the
// publication to abort on failure, and whether a Ready commit may have been
// applied although its outcome is unknown.
type createOutcome struct {
	CreateResult
	pub           Publication
	commitUnknown bool
}

// materializeAndCommit runs materialize and commits (or, when rejected,
// aborts) the reservation, recording its progress in out.
func (c *UserSpotCoordinator) materializeAndCommit(ctx context.Context, req RemoteCreate, materialize RemoteMaterializeFunc, discard DiscardFunc,
	payload []byte, current *authority.Snapshot, target authority.CreationTarget, abortReq authority.AbortRequest, out *createOutcome,
) error {
	spot := refOf(current, req.SpotID)
	local, err := materialize(ctx, payload, current)
	if err != nil {
		return err
	}
	out.pub = local.Publication
	if local.State == Rejected {
		if local.Publication != nil {
			local.Publication.Abort()
			out.pub = nil
		}
		if _, err := c.opts.Store.Abort(ctx, abortReq); err != nil {
			return failure(ctx, KindRequestFailed, "User Spot abort Store operation failed.", err)
		}
		if discard != nil {
			if err := discard(ctx); err != nil {
				return err
			}
		}
		out.CreateResult = CreateResult{Spot: spot, State: local.State, Reply: local.Reply}
		return nil
	}
	ready, err := EncodeUserSpotPayload(Payload{
		State: StateReady, StableType: req.StableType, SpotID: req.SpotID,
		OwnerID: current.OwnerID, OwnerLeaseGeneration: current.OwnerLeaseGeneration,
		OwnerMeshName: target.MeshName, OwnerNodeRID: target.NodeRID, OwnerNodeGeneration: target.NodeLifecycleGeneration,
	})
	if err != nil {
		return err
	}
	commitReq := authority.CommitRequest{
		Key:           abortReq.Key,
		ReservationID: abortReq.ReservationID, ExpectedStoreVersion: current.StoreVersion,
		Target: target, ReadyPayload: ready,
	}
	committed, err := c.opts.Store.Commit(ctx, commitReq)
	if errors.Is(err, authority.ErrOutcomeUnknown) {
		committed, err = c.resendCommit(ctx, commitReq, err)
	}
	if err != nil {
		out.commitUnknown = errors.Is(err, authority.ErrOutcomeUnknown)
		return failure(ctx, KindRequestFailed, "User Spot Ready commit Store operation failed.", err)
	}
	if committed.Kind != authority.KindCommitted && committed.Kind != authority.KindAlreadyCommitted {
		return newError(KindRequestFailed, fmt.Sprintf("Remote User Spot Ready commit failed: %s.", committed.Kind), false, nil)
	}
	spot.ObjectGeneration = committed.Ready.ObjectGeneration
	c.publishReadyRoute(req.SpotID, committed.Ready)
	if local.Publication != nil {
		local.Publication.Publish()
	}
	out.CreateResult = CreateResult{Spot: spot, State: local.State, Reply: local.Reply}
	return nil
}

// resendCommit re-sends a Ready commit whose outcome is unknown (first, the
// error it got) until the store answers it, for at most the cleanup timeout
// and not bounded by ctx: the creation's deadline may be what cut the first
// one short. A commit is idempotent (an applied one answers
// alreadyCommitted), so an answer settles the creation either way, where a
// rollback would discard a Spot whose commit was applied. While no answer
// comes (or a re-send fails in its own right), the outcome stays unknown: the
// returned error wraps first.
func (c *UserSpotCoordinator) resendCommit(ctx context.Context, req authority.CommitRequest, first error) (authority.CommitResult, error) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.CleanupTimeout)
	defer cancel()
	pause := time.Millisecond
	for {
		res, err := c.opts.Store.Commit(cctx, req)
		if err == nil {
			return res, nil
		}
		if !errors.Is(err, authority.ErrOutcomeUnknown) && !errors.Is(err, authority.ErrUnavailable) {
			// a re-send's own failure says nothing of the first commit: its
			// outcome stays unknown
			return authority.CommitResult{}, fmt.Errorf("%w (re-sent commit: %v)", first, err)
		}
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-cctx.Done():
			t.Stop()
			return authority.CommitResult{}, first
		}
		pause = min(2*pause, 100*time.Millisecond)
	}
}

// rollback aborts the reservation and discards the materialized object
// concurrently, each bounded by the cleanup timeout (which is not bounded by
// ctx: the creation's own deadline may be what failed it). It returns the
// cleanup failures. When commitUnknown, a Ready commit may have been applied:
// the object is discarded only once the abort proves the reservation was
// aborted, since discarding the object of a committed Spot would leave a
// Ready row with nothing behind it.
func (c *UserSpotCoordinator) rollback(ctx context.Context, abortReq authority.AbortRequest, discard DiscardFunc, commitUnknown bool) []error {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.CleanupTimeout)
	defer cancel()
	if commitUnknown {
		res, err := c.opts.Store.Abort(cctx, abortReq)
		switch {
		case err != nil:
			return []error{err, errObjectKept}
		case res.Kind != authority.KindAborted && res.Kind != authority.KindAlreadyAborted:
			return []error{fmt.Errorf("User Spot creation abort answered %s: %w", res.Kind, errObjectKept)}
		case discard == nil:
			return nil
		}
		if err := catchPanic("discard", func() error { return discard(cctx) }); err != nil {
			return []error{err}
		}
		return nil
	}
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
		results <- catchPanic("discard", func() error { return discard(cctx) })
	}()
	var errs []error
	for range 2 {
		select {
		case err := <-results:
			if err != nil {
				errs = append(errs, err)
			}
		case <-cctx.Done():
			// Stop waiting when the cleanup deadline passes.
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

// catchPanic runs f, an application callback of the cleanup, and returns a
// panic in it as a cleanup failure: on its own goroutine it would end the
// process, and during a creation's panic it would replace that panic.
func catchPanic(what string, f func() error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("User Spot creation cleanup: %s panicked: %v", what, v)
		}
	}()
	return f()
}

// errObjectKept is the cleanup failure of a creation whose Ready commit may
// have been applied and whose reservation could not be proven aborted: the
// materialized object was kept, not discarded. Reading the row tells which.
var errObjectKept = errors.New("the Ready commit's outcome is unknown and the reservation was not proven aborted: the materialized object was kept")

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
