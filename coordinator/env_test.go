package coordinator_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/coordinator"
	"github.com/zlink-systems/authority/provider/memory"
	"github.com/zlink-systems/authority/view"
)

var (
	nodeA  = authority.NodeDescriptor{MeshName: "mesh", RID: "node-a"}
	nodeB  = authority.NodeDescriptor{MeshName: "mesh", RID: "node-b"}
	ownerA = authority.OwnerToken{OwnerID: "owner-a", LeaseGeneration: 1}
	ownerB = authority.OwnerToken{OwnerID: "owner-b", LeaseGeneration: 1}
)

// Harness is one fresh, empty store and the controls the scenarios need (a
// subset of conformance.Harness, so a provider's conformance factory adapts
// in a few lines).
type Harness struct {
	// Store is the store under test.
	Store authority.Store
	// SetLive makes owner live or not live on node at a lifecycle generation.
	SetLive func(t testing.TB, node authority.NodeDescriptor, gen int64, owner authority.OwnerToken, live bool)
	// SetCapacityPolicy installs a capacity policy; nil skips the scenarios
	// that need one.
	SetCapacityPolicy func(t testing.TB, p authority.CapacityPolicy)
	// Now is the store's clock.
	Now func() time.Time
	// Relocation is a relocation store; nil skips the Instance scenarios.
	Relocation authority.RelocationStore
	// Reader, when set, answers the Instance authority's reads
	// (InstanceOptions.Reader).
	Reader coordinator.RowReader
}

// withView answers the scenarios' row reads from a local read view of the
// store (consistent reads): the Instance authority through
// InstanceOptions.Reader, the User Spot coordinators through a store whose
// ReadAuthority is the view's.
func withView(f Factory) Factory {
	return func(t *testing.T) *Harness {
		h := f(t)
		v, err := view.New(context.Background(), h.Store.(view.Store), view.Config{})
		if err != nil {
			t.Fatalf("view: %v", err)
		}
		t.Cleanup(func() { _ = v.Close() })
		h.Reader = v
		h.Store = viewReads{Store: h.Store, v: v}
		return h
	}
}

// viewReads is a store whose row reads a view answers.
type viewReads struct {
	authority.Store
	v *view.View
}

func (s viewReads) ReadAuthority(ctx context.Context, key authority.Key) (authority.ReadResult, error) {
	return s.v.ReadAuthority(ctx, key)
}

// Factory returns a fresh harness, registering its cleanup with t.
type Factory func(t *testing.T) *Harness

// memoryFactory is the memory provider's factory, with a relocation store.
func memoryFactory(t *testing.T) *Harness {
	live := memory.NewLiveSet()
	s := memory.New(memory.Config{Liveness: live})
	return &Harness{
		Store: s,
		SetLive: func(_ testing.TB, node authority.NodeDescriptor, gen int64, owner authority.OwnerToken, on bool) {
			live.Set(node, gen, owner, on)
		},
		SetCapacityPolicy: func(_ testing.TB, p authority.CapacityPolicy) { s.SetCapacityPolicy(p) },
		Now:               time.Now,
		Relocation:        memory.NewRelocationStore(nil),
	}
}

// withoutChangeFeed hides the store's ChangeWaiter, so the coordinators poll.
func withoutChangeFeed(f Factory) Factory {
	return func(t *testing.T) *Harness {
		h := f(t)
		h.Store = struct{ authority.Store }{h.Store}
		return h
	}
}

// env is one scenario's store plus helpers.
type env struct {
	t   *testing.T
	h   *Harness
	ctx context.Context
}

func newEnv(t *testing.T, f Factory) *env {
	h := f(t)
	h.SetLive(t, nodeA, 1, ownerA, true)
	h.SetLive(t, nodeB, 1, ownerB, true)
	return &env{t: t, h: h, ctx: context.Background()}
}

func (e *env) read(kind authority.ObjectKind, id string) authority.ReadResult {
	e.t.Helper()
	key, err := authority.EncodeKey(kind, id)
	if err != nil {
		e.t.Fatal(err)
	}
	r, err := e.h.Store.ReadAuthority(e.ctx, key)
	if err != nil {
		e.t.Fatal(err)
	}
	return r
}

func (e *env) usage(node authority.NodeDescriptor, kind authority.ObjectKind, stableType string) authority.CapacityUsage {
	e.t.Helper()
	u, err := e.h.Store.CapacityUsage(e.ctx, node, 1, kind, stableType)
	if err != nil {
		e.t.Fatal(err)
	}
	return u
}

// spotLimits is a capacity policy bounding the Spots of each listed node.
type spotLimits map[string]int64

func (l spotLimits) PlacementCapacityAvailable(node authority.NodeDescriptor, requested, reserved, active authority.CapacityVector) bool {
	limit, ok := l[node.RID]
	return !ok || reserved.Spots+active.Spots+requested.Spots <= limit
}

// countingStore counts Reserve calls and signals when a count is reached.
type countingStore struct {
	authority.Store
	reserves atomic.Int64
	mu       sync.Mutex
	waiters  map[int64]chan struct{}
}

func countReserves(s authority.Store) *countingStore {
	return &countingStore{Store: s, waiters: map[int64]chan struct{}{}}
}

func (s *countingStore) Reserve(ctx context.Context, req authority.ReserveRequest) (authority.ReserveResult, error) {
	r, err := s.Store.Reserve(ctx, req)
	n := s.reserves.Add(1)
	s.mu.Lock()
	for want, ch := range s.waiters {
		if n >= want {
			close(ch)
			delete(s.waiters, want)
		}
	}
	s.mu.Unlock()
	return r, err
}

// reached returns a channel closed once n Reserve calls returned.
func (s *countingStore) reached(n int64) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch := make(chan struct{})
	if s.reserves.Load() >= n {
		close(ch)
		return ch
	}
	s.waiters[n] = ch
	return ch
}

// WaitForChange forwards to the wrapped store's change feed; without one it
// yields briefly (the coordinator re-reads either way).
func (s *countingStore) WaitForChange(ctx context.Context, key authority.Key, seen authority.StoreVersion) error {
	if w, ok := s.Store.(authority.ChangeWaiter); ok {
		return w.WaitForChange(ctx, key, seen)
	}
	t := time.NewTimer(time.Millisecond)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// trackedBlobs records which relocation blobs are live and notifies waiters
// on every put and delete.
type trackedBlobs struct {
	authority.RelocationStore
	mu      sync.Mutex
	live    map[authority.BlobReference]bool
	puts    int
	deletes int
	changed chan struct{}
}

func trackBlobs(r authority.RelocationStore) *trackedBlobs {
	return &trackedBlobs{RelocationStore: r, live: map[authority.BlobReference]bool{}, changed: make(chan struct{})}
}

func (b *trackedBlobs) notify() {
	close(b.changed)
	b.changed = make(chan struct{})
}

func (b *trackedBlobs) PutNew(ctx context.Context, data []byte, retention time.Duration) (authority.BlobReceipt, error) {
	r, err := b.RelocationStore.PutNew(ctx, data, retention)
	b.mu.Lock()
	defer b.mu.Unlock()
	if err == nil {
		b.live[r.Reference] = true
		b.puts++
		b.notify()
	}
	return r, err
}

func (b *trackedBlobs) Delete(ctx context.Context, ref authority.BlobReference) error {
	err := b.RelocationStore.Delete(ctx, ref)
	b.mu.Lock()
	defer b.mu.Unlock()
	if err == nil && b.live[ref] {
		delete(b.live, ref)
		b.deletes++
		b.notify()
	}
	return err
}

func (b *trackedBlobs) liveCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.live)
}

// waitUntil blocks until cond holds (checked after every put and delete).
func (b *trackedBlobs) waitUntil(t *testing.T, cond func(puts, deletes int) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		b.mu.Lock()
		ok, ch := cond(b.puts, b.deletes), b.changed
		b.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-ctx.Done():
			t.Fatal("relocation store never reached the expected state")
		}
	}
}
