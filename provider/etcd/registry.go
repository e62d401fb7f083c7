package etcd

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/internal/observe"
	"github.com/zlink-systems/authority/provider/etcd/internal/txnkit"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrLeaseLost reports an operation on an owner lease that is already lost
// (expired, revoked or closed): take a new generation with Acquire.
var ErrLeaseLost = errors.New("etcd: owner lease lost")

// Registry grants owner leases: an etcd lease per owner generation, kept
// alive, with the owner's liveness key attached to it.
type Registry struct{ s *Store }

// Registry returns the store's owner registry.
func (s *Store) Registry() *Registry { return &Registry{s} }

// OwnerLease is one lease generation of an owner on a node lifecycle (see
// Registry.Acquire). While
// it is held its liveness key exists and the owner's writes pass the
// isTargetLive fence; once the lease is lost (Done closed) they fail.
type OwnerLease struct {
	token     authority.OwnerToken
	node      authority.NodeDescriptor
	lifecycle int64
	lease     clientv3.LeaseID
	r         *Registry
	done      chan struct{}
	stop      context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
	deadline  atomic.Pointer[time.Time] // see Deadline
	// revokedByStore is set by Store.Close once it tried to revoke the
	// lease, storeRevoke to that revoke's error; both are read after
	// Store.Close's heldLeases.closed channel closed.
	revokedByStore bool
	storeRevoke    error
}

// acquire takes the next lease generation of ownerID on node at lifecycle:
// it bumps the owner's generation key, grants a lease of ttl, writes the
// liveness key on it (both in one Txn) and keeps the lease alive until Close
// or until it is lost. A later Acquire of the same owner is a new generation;
// move the rows with rebindOwnerLease (or RebindRows).
func (r *Registry) acquire(ctx context.Context, node authority.NodeDescriptor, lifecycle int64, ownerID string, ttl time.Duration) (*OwnerLease, error) {
	return r.acquireNext(ctx, node, lifecycle, ownerID, ttl, func(last int64) (int64, error) { return last + 1, nil })
}

// acquireNext is acquire with the generation chosen by next from the last
// one handed to the owner in this namespace (0: none); the Txn that takes it
// holds only while the owner generation key is what next was given.
func (r *Registry) acquireNext(ctx context.Context, node authority.NodeDescriptor, lifecycle int64, ownerID string, ttl time.Duration,
	next func(last int64) (int64, error)) (*OwnerLease, error) {
	if err := validateOwnerLease(node, ownerID, ttl); err != nil {
		return nil, err
	}
	s := r.s
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	rctx, cancel := s.requestContext(ctx)
	defer cancel()
	granting := time.Now() // the lease's TTL runs from after this at the server
	grant, err := s.client.Grant(rctx, int64(max(ttl, 2*time.Second)/time.Second))
	if err != nil {
		return nil, mapError(err, false)
	}
	revoke := func() { s.revokeDetached(ctx, grant.ID) }
	genKey := s.keys.OwnerGen(ownerID)
	for attempt := 0; ; attempt++ {
		s.retrying(observe.OpOwnerLeaseAcquire, attempt)
		if attempt == maxAttempts {
			revoke()
			return nil, authority.Wrap(authority.ErrUnavailable, "owner generation contention", errContention)
		}
		resp, err := s.kv.Get(rctx, genKey)
		if err != nil {
			revoke()
			return nil, mapError(err, false)
		}
		var gen, rev int64
		if len(resp.Kvs) > 0 {
			rev = resp.Kvs[0].ModRevision
			if gen, err = schema.DecodeOwnerGeneration(resp.Kvs[0]); err != nil {
				revoke()
				return nil, err
			}
		}
		want, err := next(gen)
		if err != nil {
			revoke()
			return nil, err
		}
		token := authority.OwnerToken{OwnerID: ownerID, LeaseGeneration: want}
		live := schema.Liveness{MeshName: node.MeshName, RID: node.RID, Lifecycle: lifecycle, OwnerID: ownerID, Lease: token.LeaseGeneration}
		t := &txnkit.Txn{}
		t.Cmp(modRevIs(genKey, rev))
		t.Put(genKey, schema.EncodeOwnerGeneration(token.LeaseGeneration))
		t.Put(s.keys.Liveness(node, lifecycle, token), live.Encode(), clientv3.WithLease(grant.ID))
		s.announceOwnerLease(t, grant.ID)
		tresp, err := s.sendWrite(rctx, t, "the owner lease")
		if err != nil {
			revoke()
			return nil, err
		}
		if !tresp.Succeeded {
			continue
		}
		kctx, stop := context.WithCancel(s.life) // Store.Close ends it too
		l := &OwnerLease{token: token, node: node, lifecycle: lifecycle, lease: grant.ID, r: r, done: make(chan struct{}), stop: stop}
		if !s.held.add(l) { // the store is closing: it would not revoke l
			stop()
			revoke()
			return nil, authority.ErrClosed
		}
		first := granting.Add(time.Duration(grant.TTL) * time.Second)
		l.deadline.Store(&first)
		s.obs.Metrics().LeaseDeadline(int64(grant.ID), first) // held once Acquire returns
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			defer close(l.done)
			l.keepAlive(kctx, time.Duration(grant.TTL)*time.Second)
			l.ended(kctx.Err() == nil)
		}()
		return l, nil
	}
}

// Token returns the owner token of this lease generation.
func (l *OwnerLease) Token() authority.OwnerToken { return l.token }

// Done is closed when the lease is lost: etcd answers that it expired or was
// revoked, Deadline passes with no renewal confirmed, or Close is called. The
// store's Close stops the keep-alive too: Done closes, then Store.Close
// revokes the lease.
// It closes no later than the lease can expire at etcd, so work that must
// stop before another owner may take over can stop on it.
func (l *OwnerLease) Done() <-chan struct{} { return l.done }

// Deadline returns the time until which the lease is certainly live at etcd
// unless it was revoked or found lost (Done is closed then; check it first):
// the time the last renewal etcd confirmed was sent (at first, the grant)
// plus the TTL etcd confirmed. etcd restarts a lease's TTL when it receives
// the renewal, after it was sent, so the lease expires no earlier. It is
// measured on this process's monotonic clock: durations, not wall time, are
// compared with etcd's.
func (l *OwnerLease) Deadline() time.Time { return *l.deadline.Load() }

// Close stops the keep-alive and revokes the lease: the liveness key goes,
// the owner's rows stay. After an error (the revoke's outcome is unknown, or
// etcd was unreachable) call it again: each call tries the revoke. After
// Store.Close, which revokes every lease the store still holds (Done closed
// first), Close of a store that dialled its own client returns the outcome
// of that revoke: the client is closed, so no later call could try again
// (an unrevoked lease then expires after its TTL); on a caller's client
// (Config.Client) each call still tries the revoke.
func (l *OwnerLease) Close(ctx context.Context) error {
	l.stopKeepAlive()
	s := l.r.s
	if s.closed.Load() && s.ownsClient {
		select {
		case <-s.held.closed():
		case <-ctx.Done():
			return mapError(context.Cause(ctx), true)
		}
		return l.storeRevoke // nil also when an earlier Close revoked it
	}
	rctx, cancel := s.requestContext(ctx)
	defer cancel()
	// a lease that already expired (or an earlier Close revoked) is as gone
	// as a revoked one
	if _, err := s.client.Revoke(rctx, l.lease); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return mapError(err, true)
	}
	s.held.remove(l)
	return nil
}

// stopKeepAlive ends l's keep-alive and waits for it: Done is closed on
// return.
func (l *OwnerLease) stopKeepAlive() {
	l.closeOnce.Do(func() {
		l.stop()
		l.wg.Wait()
	})
}
