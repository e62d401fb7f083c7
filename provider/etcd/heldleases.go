package etcd

import (
	"context"
	"errors"
	"sync"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// heldLeases are the owner leases a store granted and no OwnerLease.Close
// has revoked yet. Store.Close revokes them (after their keep-alives stopped
// and Done closed), before it closes a client it dialled, so that
// OwnerLease.Close keeps its promise of a revoke after the store is closed.
// The zero value is ready to use.
type heldLeases struct {
	mu      sync.Mutex
	m       map[*OwnerLease]struct{}
	closing bool
	done    chan struct{} // closed once close has revoked every held lease
}

// add records l as held; false once the store is closing (then the caller
// revokes l itself).
func (h *heldLeases) add(l *OwnerLease) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closing {
		return false
	}
	if h.m == nil {
		h.m = map[*OwnerLease]struct{}{}
	}
	h.m[l] = struct{}{}
	return true
}

// remove forgets l: OwnerLease.Close revoked it.
func (h *heldLeases) remove(l *OwnerLease) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.m, l)
}

// closed returns a channel closed once close has revoked every held lease.
func (h *heldLeases) closed() <-chan struct{} { return h.doneChan() }

func (h *heldLeases) doneChan() chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.done == nil {
		h.done = make(chan struct{})
	}
	return h.done
}

// close stops every held lease's keep-alive (its Done closes first, so its
// holder stops before another owner can take over) and revokes it on c,
// recording the outcome in the lease for its Close.
func (h *heldLeases) close(ctx context.Context, c *clientv3.Client) {
	done := h.doneChan()
	h.mu.Lock()
	h.closing = true
	held := h.m
	h.m = nil
	h.mu.Unlock()
	for l := range held {
		l.stopKeepAlive()
		_, err := c.Revoke(ctx, l.lease)
		if err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			l.storeRevoke = mapError(err, true)
		}
		l.revokedByStore = true
	}
	close(done)
}
