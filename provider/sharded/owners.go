package sharded

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	authority "github.com/zlink-systems/authority"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
)

// Owner leases across shards. An owner holds one etcd owner lease in every
// shard, each with the owner's liveness key in that shard, on which that
// shard's writes of the owner's rows fence (as on one cluster). The
// generation is taken in the owner's home shard (the hash of its ID) with
// Acquire, then the same generation in every other shard with
// AcquireGeneration, whose Txn holds only while it is above the last one
// handed out there: generations agree across shards and rise in each. The
// owner is live only while every shard's lease is: when one is lost, Done
// closes and the others are revoked, so the owner's writes fail everywhere.

// closeTimeout bounds the revokes of the other shards' leases after one was
// lost.
const closeTimeout = 10 * time.Second

// Registry grants owner leases over every shard.
type Registry struct{ s *Store }

// OwnerHome returns the shard an owner's lease generations are taken in
// first (the hash of its ID).
func (s *Store) OwnerHome(ownerID string) int { return shardOf(ownerDomain+ownerID, len(s.shards)) }

// Registry returns the store's owner registry.
func (s *Store) Registry() *Registry { return &Registry{s} }

// OwnerLease is one lease generation of an owner on a node lifecycle, held
// in every shard.
type OwnerLease struct {
	s      *Store
	token  authority.OwnerToken
	leases []*etcdstore.OwnerLease // by shard
	done   chan struct{}
	once   sync.Once // closes done
}

// Acquire takes the owner's next lease generation on node's lifecycle in
// every shard (see Registry). When a shard cannot take it, the leases taken
// are revoked and the error names the shard.
func (r *Registry) Acquire(ctx context.Context, node authority.NodeDescriptor, lifecycle int64, ownerID string, ttl time.Duration) (*OwnerLease, error) {
	s := r.s
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	home := s.OwnerHome(ownerID)
	first, err := s.shards[home].store.Registry().Acquire(ctx, node, lifecycle, ownerID, ttl)
	if err != nil {
		return nil, inShard(home, err)
	}
	leases := make([]*etcdstore.OwnerLease, len(s.shards))
	leases[home] = first
	var others []int
	for i := range s.shards {
		if i != home {
			others = append(others, i)
		}
	}
	err = s.eachOf(ctx, others, func(ctx context.Context, i int, sh *shard) (err error) {
		leases[i], err = sh.store.Registry().AcquireGeneration(ctx, node, lifecycle, first.Token(), ttl)
		return err
	})
	if err != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
		defer cancel()
		_ = closeLeases(cctx, leases)
		return nil, err
	}
	l := &OwnerLease{s: s, token: first.Token(), leases: leases, done: make(chan struct{})}
	for _, sl := range leases {
		if !s.background(func() {
			<-sl.Done()
			l.end()
		}) {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
			defer cancel()
			_ = l.Close(cctx) // the store is closing
			return nil, authority.ErrClosed
		}
	}
	return l, nil
}

// end closes Done when a shard's lease ended (lost, or closed by its
// store), and revokes the others.
func (l *OwnerLease) end() {
	l.once.Do(func() {
		close(l.done)
		ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
		defer cancel()
		_ = closeLeases(ctx, l.leases)
	})
}

// closeLeases closes every lease of leases (nil ones skipped) in parallel.
func closeLeases(ctx context.Context, leases []*etcdstore.OwnerLease) error {
	errs := make([]error, len(leases))
	var wg sync.WaitGroup
	for i, sl := range leases {
		if sl == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = inShard(i, sl.Close(ctx))
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Token returns the owner token of this lease generation (the same in every
// shard).
func (l *OwnerLease) Token() authority.OwnerToken { return l.token }

// Done is closed once the lease is lost in any shard, or closed: the
// owner's writes then fail in every shard (the other shards' leases are
// revoked, and fail by their TTL if the revoke cannot be sent).
func (l *OwnerLease) Done() <-chan struct{} { return l.done }

// Deadline returns the earliest of the shards' deadlines
// (etcd.OwnerLease.Deadline): until then the owner is certainly live in
// every shard, unless Done is closed.
func (l *OwnerLease) Deadline() time.Time {
	d := l.leases[0].Deadline()
	for _, sl := range l.leases[1:] {
		if t := sl.Deadline(); t.Before(d) {
			d = t
		}
	}
	return d
}

// Close stops the keep-alives and revokes the lease in every shard (the
// owner's rows stay). After an error call it again: each call tries the
// revokes that failed.
func (l *OwnerLease) Close(ctx context.Context) error {
	l.once.Do(func() { close(l.done) })
	return closeLeases(ctx, l.leases)
}

// RebindRows moves every row of from (an earlier lease generation of this
// lease's owner, on this lease's node lifecycle) to this lease, every shard
// in parallel (a row locked by a cross-shard aggregate's commit is resolved
// first, twophase.Coordinator.Retry), and returns how many moved. A shard that fails leaves the
// others' rows moved and its error names it (etcd.ErrLeaseLost: this lease
// is lost there); the count includes every row moved. Call it again for
// the rest.
func (l *OwnerLease) RebindRows(ctx context.Context, from authority.OwnerToken) (int64, error) {
	var n atomic.Int64
	errs := make([]error, len(l.leases))
	var wg sync.WaitGroup
	for i, sl := range l.leases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = inShard(i, l.s.retry(ctx, func(ctx context.Context) error {
				k, err := sl.RebindRows(ctx, from)
				n.Add(k)
				return err
			}))
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return n.Load(), err
		}
	}
	return n.Load(), nil
}

// MarkLive makes owner live on node at lifecycle for ttl in every shard
// (etcd.Store.MarkLive: a lease without keep-alive; for tests and tools).
func (s *Store) MarkLive(ctx context.Context, node authority.NodeDescriptor, lifecycle int64, owner authority.OwnerToken, ttl time.Duration) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	return s.eachShard(ctx, func(ctx context.Context, _ int, sh *shard) error {
		return sh.store.MarkLive(ctx, node, lifecycle, owner, ttl)
	})
}

// MarkDead makes owner not live on node at lifecycle in every shard.
func (s *Store) MarkDead(ctx context.Context, node authority.NodeDescriptor, lifecycle int64, owner authority.OwnerToken) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	return s.run(ctx, s.all(), false, func(ctx context.Context, _ int, sh *shard) error {
		return sh.store.MarkDead(ctx, node, lifecycle, owner)
	})
}

// IsTargetLive reports whether owner is live on node at lifecycle in every
// shard (a read; writes fence on each shard's liveness key in their Txn).
func (s *Store) IsTargetLive(ctx context.Context, node authority.NodeDescriptor, lifecycle int64, owner authority.OwnerToken) (bool, error) {
	if err := s.begin(ctx); err != nil {
		return false, err
	}
	var dead atomic.Bool
	err := s.eachShard(ctx, func(ctx context.Context, _ int, sh *shard) error {
		live, err := sh.store.IsTargetLive(ctx, node, lifecycle, owner)
		if err == nil && !live {
			dead.Store(true)
		}
		return err
	})
	return err == nil && !dead.Load(), err
}
