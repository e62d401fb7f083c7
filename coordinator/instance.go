package coordinator

import (
	"context"
	"sync"
	"time"

	authority "github.com/zlink-systems/authority"
)

// CreationRequestRetention is how long an activation's recovery envelope
// blob is kept (24 hours).
const CreationRequestRetention = 24 * time.Hour

// orphanDeleteTimeout bounds the best-effort delete of an unpublished blob.
const orphanDeleteTimeout = time.Second

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

// creationTarget is target's node, on this mesh, and owner: where this
// authority reserves, commits and aborts target's activation.
func (a *InstanceActivationAuthority) creationTarget(target ActivationTarget, owner authority.OwnerToken) authority.CreationTarget {
	return authority.CreationTarget{
		MeshName: a.opts.MeshName, NodeRID: target.TargetNodeRID,
		NodeLifecycleGeneration: target.TargetNodeGeneration, Owner: owner,
	}
}
