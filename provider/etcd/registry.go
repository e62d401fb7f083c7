package etcd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/internal/observe"
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

// OwnerLease is one lease generation of an owner on a node lifecycle. While
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
}

// acquire takes the next lease generation of ownerID on node at lifecycle:
// it bumps the owner's generation key, grants a lease of ttl, writes the
// liveness key on it (both in one Txn) and keeps the lease alive until Close
// or until it is lost. A later Acquire of the same owner is a new generation;
// move the rows with rebindOwnerLease (or RebindRows).
func (r *Registry) acquire(ctx context.Context, node authority.NodeDescriptor, lifecycle int64, ownerID string, ttl time.Duration) (*OwnerLease, error) {
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
		token := authority.OwnerToken{OwnerID: ownerID, LeaseGeneration: gen + 1}
		live := schema.Liveness{MeshName: node.MeshName, RID: node.RID, Lifecycle: lifecycle, OwnerID: ownerID, Lease: token.LeaseGeneration}
		t := &txn{}
		t.cmp(modRevIs(genKey, rev))
		t.put(genKey, schema.EncodeOwnerGeneration(token.LeaseGeneration))
		t.put(s.keys.Liveness(node, lifecycle, token), live.Encode(), clientv3.WithLease(grant.ID))
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
		first := granting.Add(time.Duration(grant.TTL) * time.Second)
		l.deadline.Store(&first)
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			defer close(l.done)
			s.obs.Metrics().LeaseDeadline(int64(grant.ID), first)
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
// store's Close stops the keep-alive too (Done closes; the lease is not
// revoked: Close revokes it, else it expires after its TTL).
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
// etcd was unreachable) call it again: each call tries the revoke.
func (l *OwnerLease) Close(ctx context.Context) error {
	l.closeOnce.Do(func() {
		l.stop()
		l.wg.Wait()
	})
	rctx, cancel := l.r.s.requestContext(ctx)
	defer cancel()
	// a lease that already expired (or an earlier Close revoked) is as gone
	// as a revoked one
	if _, err := l.r.s.client.Revoke(rctx, l.lease); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return mapError(err, true)
	}
	return nil
}

// rebindRows moves every row of from (an older lease generation of the same
// owner) to this lease with rebindOwnerLease, keeping payloads. It returns
// how many rows it moved; rows that changed meanwhile are retried, reserved
// rows are left to their creation. A row that changed under every attempt
// stays on from: the other rows are still moved, and the error (wrapping
// ErrUnavailable) says how many stayed, so the caller calls it again. Onto a
// lease that is lost (Done closed) nothing can move: the error wraps
// ErrLeaseLost.
func (l *OwnerLease) rebindRows(ctx context.Context, from authority.OwnerToken) (int64, error) {
	s := l.r.s
	prefix := s.keys.OwnerRowsPrefix(from)
	var moved int64
	lost := func() error {
		select {
		case <-l.done:
			return fmt.Errorf("%w: rebind stopped after moving %d rows; acquire a new generation and rebind onto it", ErrLeaseLost, moved)
		default:
			return nil
		}
	}
	if err := lost(); err != nil {
		return 0, err
	}
	var left []authority.Key // rows that kept changing under every attempt
	start := prefix
	for {
		rctx, cancel := s.requestContext(ctx)
		idx, err := s.kv.Get(rctx, start, clientv3.WithRange(prefixEnd(prefix)), clientv3.WithKeysOnly(), clientv3.WithLimit(256))
		cancel()
		if err != nil {
			return moved, mapError(err, false)
		}
		for _, kv := range idx.Kvs {
			key := authority.Key(string(kv.Key)[len(prefix):])
			settled := false
			for attempt := 0; attempt < maxAttempts && !settled; attempt++ {
				s.retrying(observe.OpRebindRows, attempt)
				cur, err := s.ReadAuthority(ctx, key)
				if err != nil {
					return moved, err
				}
				if cur.Kind != authority.KindSnapshot || cur.Snapshot.Owner() != from || cur.Snapshot.Allocation.State != authority.AllocationActive {
					settled = true
					break
				}
				res, err := s.CompareExchangeAuthority(ctx, key, cur.Snapshot.StoreVersion,
					authority.RebindOwnerLease(from, l.token, cur.Snapshot.Payload))
				if err != nil {
					return moved, err
				}
				if res.Kind == authority.KindStored {
					moved++
					settled = true
				} else if err := lost(); err != nil {
					// every write onto a lost lease fails its liveness compare
					return moved, err
				}
			}
			if !settled {
				left = append(left, key)
			}
		}
		if !idx.More || len(idx.Kvs) == 0 {
			if len(left) > 0 {
				return moved, authority.Wrap(authority.ErrUnavailable,
					fmt.Sprintf("rebind left %d rows on the old lease generation after %d conflicting attempts each (first: %s); call RebindRows again", len(left), maxAttempts, left[0]),
					errContention)
			}
			return moved, nil
		}
		start = string(idx.Kvs[len(idx.Kvs)-1].Key) + "\x00"
	}
}
