package coordinator

import (
	"context"
	"crypto/sha256"
	"fmt"
	"sync"
	"time"

	authority "github.com/zlink-systems/authority"
)

// CreationStore is what the coordinators need of an authority store: its
// rows and the creation protocol. Every
// authority.Store is one.
type CreationStore interface {
	authority.AuthorityStore
	authority.ObjectCreationStore
}

// CreateState is the outcome of a User Spot creation.
type CreateState string

// Creation outcomes.
const (
	Created  CreateState = "created"
	Existing CreateState = "existing"
	Rejected CreateState = "rejected"
)

// SpotRef names one generation of a User Spot and where it lives.
type SpotRef struct {
	SpotID           string
	ObjectGeneration int64
	MeshName         string
	NodeRID          string
}

// CreateRequest asks for a User Spot.
type CreateRequest struct {
	SpotID     string
	StableType string
	// RequestPayload is handed to the owner's materialize (≤ 1 MiB).
	RequestPayload []byte
	// GeneratedIdentity marks a Spot ID the caller generated: finding it
	// already taken is KindSpotIDConflict instead of Existing.
	GeneratedIdentity bool
	// Timeout, when positive, bounds the call in addition to ctx. The call
	// needs a deadline from one or the other.
	Timeout time.Duration
}

// CreateResult is the outcome of GetOrCreate.
type CreateResult struct {
	Spot  SpotRef
	State CreateState
	// Reply is the application's reply, if any.
	Reply []byte
}

// Target is a placement target: a node and the owner lease that will own the
// Spot there.
type Target struct {
	MeshName       string
	NodeRID        string
	NodeGeneration int64
	Owner          authority.OwnerToken
	// IsLocal reports whether the target is this coordinator's node.
	IsLocal bool
}

// PlacementFunc chooses a placement target for req outside excluded (node
// RIDs that reported placementCapacityExhausted). ok is false when no target
// is ready.
type PlacementFunc func(ctx context.Context, req CreateRequest, excluded map[string]bool) (target Target, ok bool, err error)

// Publication is an application-side publication that the coordinator
// publishes once the Spot is Ready or aborts when creation fails.
type Publication interface {
	Publish()
	Abort()
}

// Materialized is what the application's materialize returns.
type Materialized struct {
	// State is Created, or Rejected to abandon the creation.
	State       CreateState
	Reply       []byte
	Publication Publication
}

// MaterializeFunc runs the application's lifecycle for a Spot reserved on a
// local target (GetOrCreate). creating.OwnershipToken is the Spot's fencing
// token, which a commit keeps: the Spot's code sends it with every write to
// another system (package fencing).
type MaterializeFunc func(ctx context.Context, target Target, creating *authority.Snapshot) (Materialized, error)

// RemoteMaterializeFunc runs the application's lifecycle for a Spot reserved
// on this node by a remote creator (HandleRemoteCreate); request is the
// verified creation request payload and creating.OwnershipToken the Spot's
// fencing token.
type RemoteMaterializeFunc func(ctx context.Context, request []byte, creating *authority.Snapshot) (Materialized, error)

// DiscardFunc discards whatever a failed or rejected materialize left behind.
type DiscardFunc func(ctx context.Context) error

// ReadyRoute is the route the ready-route hooks publish and forget.
type ReadyRoute struct {
	SpotID                   string
	Generation               int64
	TargetNodeRID            string
	TargetNodeGeneration     int64
	AuthorityOwnerGeneration int64
	OwnerLeaseGeneration     int64
	StoreVersion             authority.StoreVersion
	// OwnershipToken is the Ready row's fencing token
	// (authority.Snapshot.OwnershipToken).
	OwnershipToken int64
}

// UserSpotOptions configures a UserSpotCoordinator.
type UserSpotOptions struct {
	// Store is the authority store. Required.
	Store CreationStore
	// Reader answers the coordinator's row reads, its route reads among
	// them (nil: Store), for example a local read view of the User Spot rows
	// (package view).
	Reader RowReader
	// Placement chooses targets. Required for GetOrCreate.
	Placement PlacementFunc
	// Transport carries creations to remote targets. Optional.
	Transport Transport
	// NodeRID and NodeGeneration name this node as the source of remote
	// creations.
	NodeRID        string
	NodeGeneration int64
	// PublishReadyRoute is called when a Spot becomes Ready here.
	PublishReadyRoute func(meshName string, route ReadyRoute)
	// ForgetReadyRoute is called when a Spot is closed here.
	ForgetReadyRoute func(meshName string, route ReadyRoute)
	// PollInterval is the wait between reads while another creator finishes,
	// when the store has no change feed (default 10ms).
	PollInterval time.Duration
	// CleanupTimeout bounds the rollback of a failed creation (default 1s).
	CleanupTimeout time.Duration
}

// UserSpotCoordinator creates and closes User Spots. It is safe for
// concurrent use.
type UserSpotCoordinator struct {
	opts UserSpotOptions

	mu     sync.Mutex
	local  map[string]*admission // by reservation ID
	remote map[string]*admission // by spot ID NUL reservation ID
	gates  map[string]*spotGate  // by spot ID
}

// NewUserSpotCoordinator returns a coordinator over opts.Store.
func NewUserSpotCoordinator(opts UserSpotOptions) (*UserSpotCoordinator, error) {
	if opts.Store == nil {
		return nil, authority.Invalid("User Spot coordinator requires a store.")
	}
	if opts.CleanupTimeout <= 0 {
		opts.CleanupTimeout = time.Second
	}
	if opts.PollInterval <= 0 {
		opts.PollInterval = defaultPollInterval
	}
	return &UserSpotCoordinator{opts: opts, local: map[string]*admission{}, remote: map[string]*admission{}, gates: map[string]*spotGate{}}, nil
}

// GetOrCreate returns the User Spot req names, creating it if needed. The
// reservation is the only visibility barrier: the caller whose reservation
// wins runs materialize (locally, or on the target through the Transport);
// every other caller gets Existing once the winner's Spot is Ready. A
// rejected or failed materialize aborts the reservation and calls discard.
// The whole call is bounded by ctx's deadline (or req.Timeout); passing it is
// a retryable KindDeadlineExceeded.
func (c *UserSpotCoordinator) GetOrCreate(ctx context.Context, req CreateRequest, materialize MaterializeFunc, discard DiscardFunc) (CreateResult, error) {
	if err := authority.RequireText(req.SpotID, "User Spot ID"); err != nil {
		return CreateResult{}, err
	}
	if err := authority.RequireText(req.StableType, "stable type"); err != nil {
		return CreateResult{}, err
	}
	if len(req.RequestPayload) > authority.MaxPayloadBytes {
		return CreateResult{}, authority.Invalid("User Spot creation request exceeds 1 MiB.")
	}
	if materialize == nil || c.opts.Placement == nil {
		return CreateResult{}, authority.Invalid("User Spot creation requires a placement provider and a materialize function.")
	}
	if req.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, req.Timeout)
		defer cancel()
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		return CreateResult{}, authority.Invalid("User Spot creation requires an end-to-end deadline.")
	}
	if err := ctx.Err(); err != nil {
		return CreateResult{}, asDeadline(err, opUserSpotCreation)
	}
	res, err := c.getOrCreate(ctx, deadline, req, materialize, discard)
	return res, asDeadline(err, opUserSpotCreation)
}

// getOrCreate reserves the Spot on a placement target, then either creates
// it (the reservation won) or settles on the row that holds the key.
func (c *UserSpotCoordinator) getOrCreate(ctx context.Context, deadline time.Time, req CreateRequest, materialize MaterializeFunc, discard DiscardFunc) (CreateResult, error) {
	// unlock leaves the Spot's gate, entered before a local Reserve; it is
	// called as soon as the outcome no longer needs it, and at the latest on
	// return.
	unlock := func() {}
	defer func() { unlock() }()
	placed, err := c.reservePlaced(ctx, req, &unlock)
	if err != nil {
		return CreateResult{}, err
	}
	target, reserved := placed.target, placed.reserved
	cur := reserved.Current
	sameType := cur.Kind == authority.KindSnapshot && cur.Snapshot != nil &&
		cur.Snapshot.Allocation.ObjectKind == authority.ObjectUserSpot &&
		cur.Snapshot.Allocation.StableType == req.StableType
	switch {
	case reserved.Kind == authority.KindAlreadyExists || reserved.Kind == authority.KindConflict && sameType:
		return c.settleOnExisting(ctx, deadline, req, placed, unlock)
	case reserved.Kind == authority.KindTypeMismatch:
		if req.GeneratedIdentity {
			return CreateResult{}, spotIDConflict(req.SpotID)
		}
		return CreateResult{}, newError(KindSpotTypeMismatch, fmt.Sprintf("User Spot '%s' has another stable type.", req.SpotID), false, nil)
	case reserved.Kind != authority.KindReserved:
		return CreateResult{}, newError(KindRequestFailed, fmt.Sprintf("User Spot reservation failed: %s.", reserved.Kind), false, nil)
	}
	if !target.IsLocal {
		return c.remoteCreate(ctx, req, reserved.Creating, target, deadline)
	}
	rec, err := c.localRecord(req, reserved.Creating, target, deadline)
	if err != nil {
		return CreateResult{}, err
	}
	return c.handleLocalCreate(ctx, rec, func(ctx context.Context, _ []byte, creating *authority.Snapshot) (Materialized, error) {
		return materialize(ctx, target, creating)
	}, discard, unlock)
}

// placedReservation is the outcome of a reservation on a placement target.
type placedReservation struct {
	target     Target
	authTarget authority.CreationTarget
	reserved   authority.ReserveResult
}

// reservePlaced asks the placement provider for a target and reserves the
// Spot on it, excluding every node whose capacity is exhausted and asking
// again, until a reservation answers anything but
// placementCapacityExhausted. A local target's reservation is made inside
// the Spot's gate; *unlock then leaves it.
func (c *UserSpotCoordinator) reservePlaced(ctx context.Context, req CreateRequest, unlock *func()) (placedReservation, error) {
	sum := sha256.Sum256(req.RequestPayload)
	ref := EncodeContentReference(req.RequestPayload)
	excluded := map[string]bool{}
	for {
		target, ok, err := c.opts.Placement(ctx, req, excluded)
		if err != nil {
			return placedReservation{}, failure(ctx, KindRequestFailed, "User Spot placement provider failed.", err)
		}
		if !ok {
			return placedReservation{}, newError(KindPlacementCapacityExhausted, "No eligible User Spot placement target is ready.", true, nil)
		}
		if excluded[target.NodeRID] {
			return placedReservation{}, newError(KindPlacementCapacityExhausted, "No additional User Spot placement target is ready.", true, nil)
		}
		authTarget := authority.CreationTarget{
			MeshName: target.MeshName, NodeRID: target.NodeRID,
			NodeLifecycleGeneration: target.NodeGeneration, Owner: target.Owner,
		}
		creating, err := EncodeUserSpotPayload(Payload{
			State: StateCreating, StableType: req.StableType, SpotID: req.SpotID,
			OwnerID: target.Owner.OwnerID, OwnerLeaseGeneration: target.Owner.LeaseGeneration,
			OwnerMeshName: target.MeshName, OwnerNodeRID: target.NodeRID, OwnerNodeGeneration: target.NodeGeneration,
		})
		if err != nil {
			return placedReservation{}, failure(ctx, KindRequestFailed, "User Spot placement target is invalid.", err)
		}
		if target.IsLocal {
			if *unlock, err = c.lockSpot(ctx, req.SpotID); err != nil {
				*unlock = func() {}
				return placedReservation{}, err
			}
		}
		reserved, err := c.opts.Store.Reserve(ctx, authority.ReserveRequest{
			Key: authority.ObjectKey{Kind: authority.ObjectUserSpot, GlobalID: req.SpotID},
			Intent: authority.CreationIntent{
				StableType: req.StableType, RequestContentReference: ref,
				RequestSHA256: sum[:], RequestEncodedSize: int64(len(req.RequestPayload)),
			},
			Target:          authTarget,
			CreatingPayload: creating,
			Capacity:        spotCapacity(authority.ObjectUserSpot, req.StableType),
		})
		if err != nil {
			return placedReservation{}, failure(ctx, KindRequestFailed, "User Spot reservation Store operation failed.", err)
		}
		if reserved.Kind != authority.KindPlacementCapacityExhausted {
			return placedReservation{target: target, authTarget: authTarget, reserved: reserved}, nil
		}
		(*unlock)()
		excluded[target.NodeRID] = true
	}
}

// settleOnExisting answers a reservation that lost to a row of the same
// Spot type: Existing once it is Ready, sharing a local winner's admission or
// delivering the remote create of a reservation on a remote target, and an
// error when the row is on another creation target (or the caller's
// identity was generated and must not collide).
func (c *UserSpotCoordinator) settleOnExisting(ctx context.Context, deadline time.Time, req CreateRequest, placed placedReservation, unlock func()) (CreateResult, error) {
	target, cur := placed.target, placed.reserved.Current
	if cur.Kind == authority.KindSnapshot && cur.Snapshot.Allocation.State == authority.AllocationActive {
		if req.GeneratedIdentity {
			return CreateResult{}, spotIDConflict(req.SpotID)
		}
		spot, err := spotRef(cur.Snapshot, req.SpotID, req.StableType)
		if err != nil {
			return CreateResult{}, err
		}
		return CreateResult{Spot: spot, State: Existing}, nil
	}
	if cur.Kind != authority.KindSnapshot || !sameCreationTarget(cur.Snapshot, placed.authTarget) {
		if req.GeneratedIdentity {
			return CreateResult{}, spotIDConflict(req.SpotID)
		}
		return CreateResult{}, newError(KindRequestFailed, "User Spot creation requires a remote generation-fenced create operation.", false, nil)
	}
	if cur.Snapshot.Allocation.State == authority.AllocationReserved && !target.IsLocal {
		return c.remoteCreate(ctx, req, cur.Snapshot, target, deadline)
	}
	if cur.Snapshot.Allocation.State == authority.AllocationReserved && target.IsLocal {
		var admitted *admission
		if p := cur.Snapshot.PendingCreation; p != nil {
			c.mu.Lock()
			admitted = c.local[p.ReservationID]
			c.mu.Unlock()
		}
		unlock()
		if admitted != nil {
			res, err := admitted.wait(ctx)
			if err == nil && res.State == Created {
				res.State = Existing
			}
			return res, err
		}
	}
	unlock()
	spot, err := c.awaitReady(ctx, req)
	if err != nil {
		return CreateResult{}, err
	}
	return CreateResult{Spot: spot, State: Existing}, nil
}

// awaitReady waits until the Spot is Ready, on the store's change feed when
// it has one, else polling.
func (c *UserSpotCoordinator) awaitReady(ctx context.Context, req CreateRequest) (SpotRef, error) {
	key, err := authority.EncodeKey(authority.ObjectUserSpot, req.SpotID)
	if err != nil {
		return SpotRef{}, err
	}
	for {
		if err := ctx.Err(); err != nil {
			return SpotRef{}, err
		}
		cur, err := readRow(ctx, c.rows(), authority.ObjectUserSpot, key)
		if err != nil {
			return SpotRef{}, err
		}
		if cur.Kind == authority.KindSnapshot && cur.Snapshot.Allocation.State == authority.AllocationActive {
			return spotRef(cur.Snapshot, req.SpotID, req.StableType)
		}
		if err := waitForChange(ctx, c.opts.Store, key, seenVersion(cur), c.opts.PollInterval); err != nil {
			return SpotRef{}, err
		}
	}
}

func (c *UserSpotCoordinator) localRecord(req CreateRequest, s *authority.Snapshot, target Target, deadline time.Time) (RemoteCreate, error) {
	if s == nil || s.PendingCreation == nil {
		return RemoteCreate{}, newError(KindRequestFailed, "Local User Spot Pending creation projection is missing.", false, nil)
	}
	return RemoteCreate{
		SourceNodeRID:        target.NodeRID,
		SourceNodeGeneration: target.NodeGeneration,
		SpotID:               req.SpotID,
		StableType:           req.StableType,
		Reservation:          reservationOf(s, target.NodeRID, target.NodeGeneration),
		Deadline:             deadline,
	}, nil
}

func reservationOf(s *authority.Snapshot, nodeRID string, nodeGeneration int64) RemoteReservation {
	return RemoteReservation{
		ReservationID:              s.PendingCreation.ReservationID,
		ExpectedStoreVersion:       s.StoreVersion,
		ObjectGeneration:           s.ObjectGeneration,
		AuthorityOwnerGeneration:   s.AuthorityOwnerGeneration,
		TargetNodeRID:              nodeRID,
		TargetNodeGeneration:       nodeGeneration,
		TargetOwnerID:              s.OwnerID,
		TargetOwnerLeaseGeneration: s.OwnerLeaseGeneration,
		PendingCapacityDelta:       s.Allocation.Capacity.Spots,
	}
}

func spotCapacity(kind authority.ObjectKind, stableType string) authority.CapacityVector {
	return authority.CapacityVector{Spots: 1, SpotType: &authority.SpotTypeCapacity{ObjectKind: kind, StableType: stableType, Count: 1}}
}

func spotIDConflict(spotID string) error {
	return newError(KindSpotIDConflict, fmt.Sprintf("Generated User Spot ID '%s' is already active.", spotID), false, nil)
}

// spotRef checks that s is the Ready authority of the User Spot and returns
// its reference.
func spotRef(s *authority.Snapshot, spotID, stableType string) (SpotRef, error) {
	p, ok := DecodeReadySpot(s.Payload)
	if !ok || p.Kind != authority.ObjectUserSpot || p.StableType != stableType || p.SpotID != spotID {
		return SpotRef{}, newError(KindRequestFailed, "User Spot Ready authority does not match the requested identity.", false, nil)
	}
	return refOf(s, spotID), nil
}

func refOf(s *authority.Snapshot, spotID string) SpotRef {
	return SpotRef{
		SpotID: spotID, ObjectGeneration: s.ObjectGeneration,
		MeshName: s.Allocation.Descriptor.MeshName, NodeRID: s.Allocation.Descriptor.RID,
	}
}

func sameCreationTarget(s *authority.Snapshot, t authority.CreationTarget) bool {
	return s.Allocation.Descriptor.MeshName == t.MeshName &&
		s.Allocation.Descriptor.RID == t.NodeRID &&
		s.Allocation.DescriptorLifecycleGeneration == t.NodeLifecycleGeneration &&
		s.Owner() == t.Owner
}

func readyRoute(spotID string, s *authority.Snapshot) ReadyRoute {
	return ReadyRoute{
		SpotID: spotID, Generation: s.ObjectGeneration,
		TargetNodeRID:            s.Allocation.Descriptor.RID,
		TargetNodeGeneration:     s.Allocation.DescriptorLifecycleGeneration,
		AuthorityOwnerGeneration: s.AuthorityOwnerGeneration,
		OwnerLeaseGeneration:     s.OwnerLeaseGeneration,
		StoreVersion:             s.StoreVersion,
		OwnershipToken:           s.OwnershipToken,
	}
}

// userSpotPayload is the payload of s in state.
func userSpotPayload(s *authority.Snapshot, spotID string, state State) ([]byte, error) {
	return EncodeUserSpotPayload(Payload{
		State: state, StableType: s.Allocation.StableType, SpotID: spotID,
		OwnerID: s.OwnerID, OwnerLeaseGeneration: s.OwnerLeaseGeneration,
		OwnerMeshName: s.Allocation.Descriptor.MeshName, OwnerNodeRID: s.Allocation.Descriptor.RID,
		OwnerNodeGeneration: s.Allocation.DescriptorLifecycleGeneration,
	})
}

func (c *UserSpotCoordinator) publishReadyRoute(spotID string, s *authority.Snapshot) {
	if c.opts.PublishReadyRoute != nil {
		c.opts.PublishReadyRoute(s.Allocation.Descriptor.MeshName, readyRoute(spotID, s))
	}
}

func (c *UserSpotCoordinator) forgetReadyRoute(spotID string, s *authority.Snapshot) {
	if c.opts.ForgetReadyRoute != nil {
		c.opts.ForgetReadyRoute(s.Allocation.Descriptor.MeshName, readyRoute(spotID, s))
	}
}
