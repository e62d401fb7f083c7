package sharded

import (
	"context"
	"errors"
	"fmt"
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
// first (the hash of its ID) under the map in force.
func (s *Store) OwnerHome(ownerID string) int {
	return shardOf(ownerDomain+ownerID, len(s.topo.Load().shards))
}

// Registry returns the store's owner registry.
func (s *Store) Registry() *Registry { return &Registry{s} }

// OwnerLease is one lease generation of an owner on a node lifecycle, held
// in every shard, and in every cluster a resharding adds (see ownerSet).
type OwnerLease struct {
	s         *Store
	token     authority.OwnerToken
	node      authority.NodeDescriptor
	lifecycle int64
	ttl       time.Duration
	done      chan struct{}
	once      sync.Once // closes done

	mu     sync.Mutex
	leases map[*shard]*etcdstore.OwnerLease
}

// Acquire takes the owner's next lease generation on node's lifecycle in
// every shard (see Registry), and in the new cluster of a resharding in
// progress. When a shard cannot take it, the leases taken are revoked and
// the error names the shard. While a resharding's switch is under way it
// waits for it (ErrMoving): the switch copies the owner generations.
func (r *Registry) Acquire(ctx context.Context, node authority.NodeDescriptor, lifecycle int64, ownerID string, ttl time.Duration) (*OwnerLease, error) {
	s := r.s
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	var l *OwnerLease
	err := s.rerouted(ctx, func(t *topology) error {
		if err := t.refuseFrozen("An owner lease"); err != nil {
			return err
		}
		var err error
		l, err = r.acquire(ctx, t, node, lifecycle, ownerID, ttl)
		return err
	})
	if err != nil {
		return nil, err
	}
	if !s.owners.add(l) {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
		defer cancel()
		_ = l.Close(cctx) // the store is closing
		return nil, authority.ErrClosed
	}
	// a store the map added while this lease was taken
	s.owners.extend(s, s.topo.Load().stores())
	return l, nil
}

// acquire takes the lease in t's home shard (fenced on its map key), then
// the same generation in t's other stores.
func (r *Registry) acquire(ctx context.Context, t *topology, node authority.NodeDescriptor, lifecycle int64, ownerID string, ttl time.Duration) (*OwnerLease, error) {
	s := r.s
	home := shardOf(ownerDomain+ownerID, len(t.shards))
	first, err := t.shards[home].store.Registry().Acquire(t.at(ctx, home), node, lifecycle, ownerID, ttl)
	if err != nil {
		return nil, inShard(home, err)
	}
	l := &OwnerLease{s: s, token: first.Token(), node: node, lifecycle: lifecycle, ttl: ttl, done: make(chan struct{}),
		leases: map[*shard]*etcdstore.OwnerLease{t.shards[home]: first}}
	l.watch(first)
	var others []*shard
	for _, sh := range t.stores() {
		if sh != t.shards[home] {
			others = append(others, sh)
		}
	}
	if err := l.takeIn(ctx, others); err != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
		defer cancel()
		_ = l.Close(cctx)
		return nil, err
	}
	return l, nil
}

// takeIn takes the lease's generation in every store of stores it does not
// hold it in yet (in parallel), each watched: losing it ends the lease.
func (l *OwnerLease) takeIn(ctx context.Context, stores []*shard) error {
	var mu sync.Mutex
	var first error
	var wg sync.WaitGroup
	for _, sh := range stores {
		l.mu.Lock()
		_, held := l.leases[sh]
		l.mu.Unlock()
		if held {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sl, err := sh.store.Registry().AcquireGeneration(ctx, l.node, l.lifecycle, l.token, l.ttl)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if first == nil {
					first = inShard(sh.index, err)
				}
				return
			}
			l.mu.Lock()
			l.leases[sh] = sl
			l.mu.Unlock()
			l.watch(sl)
		}()
	}
	wg.Wait()
	return first
}

// watch ends l when sl ends.
func (l *OwnerLease) watch(sl *etcdstore.OwnerLease) {
	if !l.s.background(func() {
		select {
		case <-sl.Done():
			l.end()
		case <-l.done:
		}
	}) {
		l.end()
	}
}

// held returns the leases of every store.
func (l *OwnerLease) held() []*etcdstore.OwnerLease {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]*etcdstore.OwnerLease, 0, len(l.leases))
	for _, sl := range l.leases {
		out = append(out, sl)
	}
	return out
}

// end closes Done when a shard's lease ended (lost, or closed by its
// store), and revokes the others.
func (l *OwnerLease) end() {
	l.once.Do(func() {
		close(l.done)
		l.s.owners.remove(l)
		ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
		defer cancel()
		_ = closeLeases(ctx, l.held())
	})
}

// closeLeases closes every lease of leases in parallel.
func closeLeases(ctx context.Context, leases []*etcdstore.OwnerLease) error {
	errs := make([]error, len(leases))
	var wg sync.WaitGroup
	for i, sl := range leases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = sl.Close(ctx)
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
	var d time.Time
	for _, sl := range l.held() {
		if t := sl.Deadline(); d.IsZero() || t.Before(d) {
			d = t
		}
	}
	return d
}

// Close stops the keep-alives and revokes the lease in every shard (the
// owner's rows stay). After an error call it again: each call tries the
// revokes that failed.
func (l *OwnerLease) Close(ctx context.Context) error {
	l.once.Do(func() {
		close(l.done)
		l.s.owners.remove(l)
	})
	return closeLeases(ctx, l.held())
}

// RebindRows moves every row of from (an earlier lease generation of this
// lease's owner, on this lease's node lifecycle) to this lease, every shard
// of the map in force in parallel (a row locked by a cross-shard
// aggregate's commit is resolved first, twophase.Coordinator.Retry), and
// returns how many moved. A shard that
// fails leaves the others' rows moved and its error names it
// (etcd.ErrLeaseLost: this lease is lost there); the count includes every
// row moved. Call it again for the rest. While a resharding's switch is
// under way it waits for it (ErrMoving).
func (l *OwnerLease) RebindRows(ctx context.Context, from authority.OwnerToken) (int64, error) {
	var n atomic.Int64
	err := l.s.rerouted(ctx, func(t *topology) error {
		if err := t.refuseFrozen("Rebinding an owner's rows"); err != nil {
			return err
		}
		return l.s.run(ctx, t, t.all(), false, func(ctx context.Context, i int, sh *shard) error {
			l.mu.Lock()
			sl := l.leases[sh]
			l.mu.Unlock()
			if sl == nil {
				return fmt.Errorf("%w: owner %q generation %d holds no lease in shard %d yet", etcdstore.ErrLeaseLost,
					l.token.OwnerID, l.token.LeaseGeneration, i)
			}
			return t.retry(t.at(ctx, i), func(ctx context.Context) error {
				k, err := sl.RebindRows(ctx, from)
				n.Add(k)
				return err
			})
		})
	})
	return n.Load(), err
}

// ownerSet is a store's live owner leases: each holds a lease in every
// store the map in force (and a move in progress) writes to, so when a
// reload adds a store, each lease is taken there too.
type ownerSet struct {
	mu     sync.Mutex
	leases map[*OwnerLease]struct{}
}

func (o *ownerSet) add(l *OwnerLease) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	select {
	case <-l.done:
		return false
	default:
	}
	if o.leases == nil {
		o.leases = map[*OwnerLease]struct{}{}
	}
	o.leases[l] = struct{}{}
	return true
}

func (o *ownerSet) remove(l *OwnerLease) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.leases, l)
}

// extend takes every live lease in stores (those it holds already are
// skipped); a lease that cannot be taken somewhere is logged and taken at
// the next reload (the resharding job waits for it).
func (o *ownerSet) extend(s *Store, stores []*shard) {
	o.mu.Lock()
	live := make([]*OwnerLease, 0, len(o.leases))
	for l := range o.leases {
		live = append(live, l)
	}
	o.mu.Unlock()
	for _, l := range live {
		ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
		err := l.takeIn(ctx, stores)
		cancel()
		if err != nil && s.cfg.Logger != nil {
			s.cfg.Logger.Warn("taking an owner lease in a cluster the shard map added", "owner", l.token.OwnerID,
				"generation", l.token.LeaseGeneration, "err", err)
		}
	}
}

// MarkLive makes owner live on node at lifecycle for ttl in every shard,
// and in the new cluster of a resharding in progress (etcd.Store.MarkLive:
// a lease without keep-alive; for tests and tools).
func (s *Store) MarkLive(ctx context.Context, node authority.NodeDescriptor, lifecycle int64, owner authority.OwnerToken, ttl time.Duration) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	return s.eachStore(ctx, true, func(ctx context.Context, sh *shard) error {
		return sh.store.MarkLive(ctx, node, lifecycle, owner, ttl)
	})
}

// MarkDead makes owner not live on node at lifecycle in every shard.
func (s *Store) MarkDead(ctx context.Context, node authority.NodeDescriptor, lifecycle int64, owner authority.OwnerToken) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	return s.eachStore(ctx, false, func(ctx context.Context, sh *shard) error {
		return sh.store.MarkDead(ctx, node, lifecycle, owner)
	})
}

// eachStore runs fn on every store of the map in force and of a move in
// progress, in parallel; with stop, the others' context ends once one
// failed. The lowest shard's error is returned.
func (s *Store) eachStore(ctx context.Context, stop bool, fn func(ctx context.Context, sh *shard) error) error {
	t := s.topo.Load()
	all := &topology{shards: t.stores()}
	return s.run(ctx, all, all.all(), stop, func(ctx context.Context, _ int, sh *shard) error { return fn(ctx, sh) })
}

// IsTargetLive reports whether owner is live on node at lifecycle in every
// shard (a read; writes fence on each shard's liveness key in their Txn).
func (s *Store) IsTargetLive(ctx context.Context, node authority.NodeDescriptor, lifecycle int64, owner authority.OwnerToken) (bool, error) {
	if err := s.begin(ctx); err != nil {
		return false, err
	}
	var dead atomic.Bool
	t := s.topo.Load()
	err := s.eachShard(ctx, t, func(ctx context.Context, _ int, sh *shard) error {
		live, err := sh.store.IsTargetLive(ctx, node, lifecycle, owner)
		if err == nil && !live {
			dead.Store(true)
		}
		return err
	})
	return err == nil && !dead.Load(), err
}
