package coordinator

import (
	"context"
	"fmt"

	authority "github.com/zlink-systems/authority"
)

// CloseOwnerFunc asks the Spot's owner to close it; closing is the row in the
// Closing state. It returns false when the owner declines.
type CloseOwnerFunc func(ctx context.Context, current SpotRef, closing *authority.Snapshot) (bool, error)

// CloseHooks are the optional checks of Close.
type CloseHooks struct {
	// OwnerPresent reports whether the owner still holds the Spot; false is
	// a retryable KindSpotMoving.
	OwnerPresent func(current SpotRef) bool
	// OwnerCanClose reports whether the owner accepts a close now; false
	// makes Close return false without touching the row.
	OwnerCanClose func(current SpotRef) bool
}

// Close closes the User Spot generation spot names: Ready → Closing, the
// owner's close, then delete. When the owner declines or fails, the row is
// restored to Ready. It returns false when the Spot is already gone or the
// owner declined. A generation or route that is not the current one is
// KindSpotGenerationStale.
func (c *UserSpotCoordinator) Close(ctx context.Context, spot SpotRef, closeOwner CloseOwnerFunc, hooks CloseHooks) (bool, error) {
	if closeOwner == nil {
		return false, authority.Invalid("User Spot close requires a close function.")
	}
	key, current, err := c.readToClose(ctx, spot.SpotID, spot.ObjectGeneration)
	if err != nil || current == nil {
		return false, err
	}
	currentRef, err := spotRef(current, spot.SpotID, current.Allocation.StableType)
	if err != nil {
		return false, err
	}
	if current.Allocation.Descriptor.RID != spot.NodeRID || current.Allocation.Descriptor.MeshName != spot.MeshName {
		return false, newError(KindSpotGenerationStale, fmt.Sprintf("User Spot '%s' owner route is stale.", spot.SpotID), false, nil)
	}
	if hooks.OwnerPresent != nil && !hooks.OwnerPresent(currentRef) {
		return false, newError(KindSpotMoving, fmt.Sprintf("User Spot '%s' is missing from its authority owner.", spot.SpotID), true, nil)
	}
	if hooks.OwnerCanClose != nil && !hooks.OwnerCanClose(currentRef) {
		return false, nil
	}
	closing, err := c.beginClosing(ctx, key, current, spot.SpotID)
	if err != nil {
		return false, err
	}
	closed, err := closeOwner(ctx, currentRef, closing)
	if err != nil {
		if rerr := c.restoreReady(ctx, key, closing, spot.SpotID); rerr != nil {
			return false, rerr
		}
		return false, err
	}
	if !closed {
		return false, c.restoreReady(ctx, key, closing, spot.SpotID)
	}
	deleted, err := c.opts.Store.CompareExchangeAuthority(ctx, key, closing.StoreVersion, authority.Delete())
	if err != nil {
		return false, failure(ctx, KindRequestFailed, "User Spot delete Store operation failed.", err)
	}
	switch deleted.Kind {
	case authority.KindDeleted:
		c.forgetReadyRoute(spot.SpotID, current)
		return true, nil
	case authority.KindConflict:
		return false, newError(KindSpotMoving, fmt.Sprintf("User Spot '%s' authority changed while closing.", spot.SpotID), true, nil)
	}
	return false, newError(KindSpotGenerationStale, fmt.Sprintf("User Spot '%s' generation cannot be closed.", spot.SpotID), false, nil)
}

// RemoteClose asks this node to close one exact User Spot generation.
type RemoteClose struct {
	SpotID                   string
	ObjectGeneration         int64
	AuthorityOwnerGeneration int64
	ExpectedStoreVersion     authority.StoreVersion
	TargetNodeRID            string
	TargetNodeGeneration     int64
}

// HandleRemoteClose closes, on this node, the User Spot generation req names,
// which must still be the exact active row (else KindSpotMoving). The owner's
// close runs between Closing and delete as in Close.
func (c *UserSpotCoordinator) HandleRemoteClose(ctx context.Context, req RemoteClose, closeOwner func(ctx context.Context, spot SpotRef) (bool, error)) (bool, error) {
	if closeOwner == nil {
		return false, authority.Invalid("User Spot close requires a close function.")
	}
	key, current, err := c.readToClose(ctx, req.SpotID, req.ObjectGeneration)
	if err != nil || current == nil {
		return false, err
	}
	if current.AuthorityOwnerGeneration != req.AuthorityOwnerGeneration ||
		current.StoreVersion != req.ExpectedStoreVersion ||
		current.Allocation.Descriptor.RID != req.TargetNodeRID ||
		current.Allocation.DescriptorLifecycleGeneration != req.TargetNodeGeneration ||
		current.Allocation.ObjectKind != authority.ObjectUserSpot ||
		current.Allocation.State != authority.AllocationActive {
		return false, newError(KindSpotMoving, fmt.Sprintf("User Spot '%s' close authority is moving.", req.SpotID), true, nil)
	}
	spot := refOf(current, req.SpotID)
	closing, err := c.beginClosing(ctx, key, current, req.SpotID)
	if err != nil {
		return false, err
	}
	closed, err := closeOwner(ctx, spot)
	if err != nil {
		if rerr := c.restoreReady(ctx, key, closing, req.SpotID); rerr != nil {
			return false, rerr
		}
		return false, err
	}
	if !closed {
		return false, c.restoreReady(ctx, key, closing, req.SpotID)
	}
	deleted, err := c.opts.Store.CompareExchangeAuthority(ctx, key, closing.StoreVersion, authority.Delete())
	if err != nil {
		return false, failure(ctx, KindRequestFailed, "User Spot delete Store operation failed.", err)
	}
	if deleted.Kind == authority.KindDeleted {
		c.forgetReadyRoute(req.SpotID, current)
		return true, nil
	}
	return false, newError(KindSpotMoving, fmt.Sprintf("User Spot '%s' authority changed while closing.", req.SpotID), true, nil)
}

// beginClosing moves the Ready row current to Closing.
func (c *UserSpotCoordinator) beginClosing(ctx context.Context, key authority.Key, current *authority.Snapshot, spotID string) (*authority.Snapshot, error) {
	ready, ok := DecodeReadySpot(current.Payload)
	if !ok || ready.Kind != authority.ObjectUserSpot || ready.SpotID != spotID || ready.StableType != current.Allocation.StableType {
		return nil, newError(KindSpotMoving, fmt.Sprintf("User Spot '%s' is not in Framework-owned Ready state.", spotID), true, nil)
	}
	payload, err := userSpotPayload(current, spotID, StateClosing)
	if err != nil {
		return nil, err
	}
	res, err := c.opts.Store.CompareExchangeAuthority(ctx, key, current.StoreVersion, authority.Put(payload))
	if err != nil {
		return nil, failure(ctx, KindRequestFailed, "User Spot Closing Store operation failed.", err)
	}
	if res.Kind != authority.KindStored {
		return nil, newError(KindSpotMoving, "User Spot authority changed while entering Closing.", true, nil)
	}
	return res.Snapshot, nil
}

// restoreReady puts the Closing row back to Ready after a declined or failed
// close.
func (c *UserSpotCoordinator) restoreReady(ctx context.Context, key authority.Key, closing *authority.Snapshot, spotID string) error {
	payload, err := userSpotPayload(closing, spotID, StateReady)
	if err != nil {
		return err
	}
	res, err := c.opts.Store.CompareExchangeAuthority(ctx, key, closing.StoreVersion, authority.Put(payload))
	if err != nil {
		return failure(ctx, KindRequestFailed, "User Spot Ready restore Store operation failed.", err)
	}
	if res.Kind != authority.KindStored {
		return newError(KindSpotMoving, "User Spot Ready authority could not be restored after close was declined.", true, nil)
	}
	return nil
}

// readToClose reads the User Spot row of spotID for a close of generation:
// its key and row, no row when the Spot is gone, KindSpotGenerationStale
// when the row holds another generation.
func (c *UserSpotCoordinator) readToClose(ctx context.Context, spotID string, generation int64) (authority.Key, *authority.Snapshot, error) {
	key, read, err := readSpot(ctx, c.rows(), authority.ObjectUserSpot, spotID)
	if err != nil || read.Kind != authority.KindSnapshot {
		return key, nil, err
	}
	if read.Snapshot.ObjectGeneration != generation {
		return key, nil, newError(KindSpotGenerationStale, fmt.Sprintf("User Spot '%s' generation is stale.", spotID), false, nil)
	}
	return key, read.Snapshot, nil
}
