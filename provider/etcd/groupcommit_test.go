package etcd_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
)

// reserveAll runs every request on its own goroutine, all started together,
// on the store picked for each, and returns the results in order.
func reserveAll(stores []*etcdstore.Store, reqs []authority.ReserveRequest) ([]authority.ReserveResult, []error) {
	outs := make([]authority.ReserveResult, len(reqs))
	errs := make([]error, len(reqs))
	var start, done sync.WaitGroup
	start.Add(1)
	for i := range reqs {
		done.Add(1)
		go func() {
			defer done.Done()
			start.Wait()
			outs[i], errs[i] = stores[i%len(stores)].Reserve(context.Background(), reqs[i])
		}()
	}
	start.Done()
	done.Wait()
	return outs, errs
}

func kinds(t *testing.T, outs []authority.ReserveResult, errs []error) map[authority.ResultKind]int {
	t.Helper()
	m := map[authority.ResultKind]int{}
	for i, o := range outs {
		require.NoError(t, errs[i], "request %d", i)
		m[o.Kind]++
	}
	return m
}

// requireNodeConsistent checks the node's reserved actor count, the rows and
// the capacity index agree with the reservations made.
func requireNodeConsistent(t *testing.T, fx *conformance.Fixture, outs []authority.ReserveResult, reserved int) {
	t.Helper()
	fx.RequireUsage(conformance.NodeA, authority.ObjectActor, "", 0, int64(reserved))
	rows := fx.ListAll(authority.KindPrefix(authority.ObjectActor), 100)
	require.Len(t, rows, reserved)
	byID := map[string]bool{}
	for _, o := range outs {
		if o.Kind == authority.KindReserved {
			byID[o.ReservationID] = true
		}
	}
	for _, r := range rows {
		require.NotNil(t, r.Snapshot.PendingCreation)
		require.True(t, byID[r.Snapshot.PendingCreation.ReservationID], "row %s is a reported reservation", r.Key)
	}
}

// TestGroupCommitOneNode: 64 concurrent reservations of distinct keys on one
// node with room for 40: exactly 40 reserved, 24 exhausted, nothing
// unavailable, in at most 2 round trips per reservation (no retry storm).
func TestGroupCommitOneNode(t *testing.T) {
	var rpcs atomic.Int64
	c := server.Client(t)
	c.KV = countingKV{c.KV, &rpcs}
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, c, etcdstore.Config{Clock: clock})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	s.SetCapacityPolicy(conformance.ActorLimit(40))
	reqs := make([]authority.ReserveRequest, 64)
	for i := range reqs {
		reqs[i] = fx.ReserveRequest(authority.ObjectActor, fmt.Sprintf("k%02d", i), conformance.TargetA)
	}
	before := rpcs.Load()
	outs, errs := reserveAll([]*etcdstore.Store{s}, reqs)
	used := rpcs.Load() - before
	require.Equal(t, map[authority.ResultKind]int{authority.KindReserved: 40, authority.KindPlacementCapacityExhausted: 24}, kinds(t, outs, errs))
	require.LessOrEqual(t, used, int64(2*len(reqs)), "round trips of %d reservations", len(reqs))
	requireNodeConsistent(t, fx, outs, 40)
	for i, o := range outs {
		if o.Kind == authority.KindReserved {
			got := fx.MustRow(fx.Key(authority.ObjectActor, fmt.Sprintf("k%02d", i)))
			conformance.RequireSameRow(t, o.Creating, got)
			require.Equal(t, reqs[i].CreatingPayload, got.Payload)
		}
	}
}

// TestGroupCommitTwoStores: two stores (two queues) on the same node fence
// each other's batches; conflicts retry from the Else reads and the count
// stays exact.
func TestGroupCommitTwoStores(t *testing.T) {
	clock := authority.NewManualClock(testEpoch)
	s1 := newStore(t, nil, etcdstore.Config{Clock: clock})
	s2 := newStore(t, nil, etcdstore.Config{Clock: clock, Namespace: s1.Namespace(), SkipVersionCheck: true})
	fx := conformance.NewFixture(t, harnessFor(s1, clock))
	for _, s := range []*etcdstore.Store{s1, s2} {
		s.SetCapacityPolicy(conformance.ActorLimit(40))
	}
	reqs := make([]authority.ReserveRequest, 64)
	for i := range reqs {
		reqs[i] = fx.ReserveRequest(authority.ObjectActor, fmt.Sprintf("k%02d", i), conformance.TargetA)
	}
	outs, errs := reserveAll([]*etcdstore.Store{s1, s2}, reqs)
	require.Equal(t, map[authority.ResultKind]int{authority.KindReserved: 40, authority.KindPlacementCapacityExhausted: 24}, kinds(t, outs, errs))
	requireNodeConsistent(t, fx, outs, 40)
}

// TestGroupCommitMixedOutcomes: in one burst, requests for existing rows,
// for one contended key, for a dead owner and for fresh keys each get their
// own outcome; the refused ones do not fail the batch for the others.
func TestGroupCommitMixedOutcomes(t *testing.T) {
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, nil, etcdstore.Config{Clock: clock})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	active := fx.Active(authority.ObjectActor, "active", conformance.TargetA)
	reserved := fx.Reserve(authority.ObjectActor, "reserved", conformance.TargetA)
	dead := conformance.Target(conformance.NodeA, conformance.NodeLifecycle, authority.OwnerToken{OwnerID: "dead", LeaseGeneration: 1})
	s.SetCapacityPolicy(conformance.ActorLimit(30)) // 2 used: room for 28
	var reqs []authority.ReserveRequest
	for i := 0; i < 8; i++ {
		reqs = append(reqs, fx.ReserveRequest(authority.ObjectActor, "active", conformance.TargetA))
		reqs = append(reqs, fx.ReserveRequest(authority.ObjectActor, "reserved", conformance.TargetA))
		reqs = append(reqs, fx.ReserveRequest(authority.ObjectActor, "contended", conformance.TargetA))
		reqs = append(reqs, fx.ReserveRequest(authority.ObjectActor, fmt.Sprintf("dead%d", i), dead))
	}
	for i := 0; i < 32; i++ {
		reqs = append(reqs, fx.ReserveRequest(authority.ObjectActor, fmt.Sprintf("fresh%02d", i), conformance.TargetA))
	}
	outs, errs := reserveAll([]*etcdstore.Store{s}, reqs)
	got := kinds(t, outs, errs)
	// 28 places for 32 fresh keys and the contended one
	require.Equal(t, 28, got[authority.KindReserved], "%v", got)
	contended := countContendedConflicts(outs, reqs)
	require.Equal(t, 32+8-28, got[authority.KindPlacementCapacityExhausted]+contended, "%v", got)
	require.Equal(t, 8+8+contended, got[authority.KindConflict], "%v", got)
	require.Equal(t, 8, got[authority.KindAlreadyExists], "%v", got)
	winners := 0
	for i, o := range outs {
		switch reqs[i].Key.GlobalID {
		case "active":
			require.Equal(t, authority.KindAlreadyExists, o.Kind)
			conformance.RequireSameRow(t, active, o.Current.Snapshot)
		case "reserved":
			require.Equal(t, authority.KindConflict, o.Kind)
			conformance.RequireSameRow(t, reserved.Res.Creating, o.Current.Snapshot)
		case "contended":
			if o.Kind == authority.KindReserved {
				winners++
			}
		}
		if reqs[i].Target == dead {
			require.Equal(t, authority.KindConflict, o.Kind)
			require.Equal(t, authority.KindMissing, o.Current.Kind)
		}
	}
	require.LessOrEqual(t, winners, 1)
	if contended > 0 {
		require.Equal(t, 1, winners, "a contended request conflicts only with the winner's row")
	}
	fx.RequireUsage(conformance.NodeA, authority.ObjectActor, "", 1, 1+28)
}

// countContendedConflicts counts the conflicts of the "contended" key.
func countContendedConflicts(outs []authority.ReserveResult, reqs []authority.ReserveRequest) int {
	n := 0
	for i, o := range outs {
		if reqs[i].Key.GlobalID == "contended" && o.Kind == authority.KindConflict {
			n++
		}
	}
	return n
}

// TestGroupCommitSmallTxnLimit: with --max-txn-ops 8 a batch holds two
// reservations; 20 concurrent ones still all succeed.
func TestGroupCommitSmallTxnLimit(t *testing.T) {
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, nil, etcdstore.Config{Clock: clock, MaxTxnOps: 8})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	s.SetCapacityPolicy(conformance.ActorLimit(100))
	reqs := make([]authority.ReserveRequest, 20)
	for i := range reqs {
		reqs[i] = fx.ReserveRequest(authority.ObjectActor, fmt.Sprintf("k%02d", i), conformance.TargetA)
	}
	outs, errs := reserveAll([]*etcdstore.Store{s}, reqs)
	require.Equal(t, map[authority.ResultKind]int{authority.KindReserved: 20}, kinds(t, outs, errs))
	requireNodeConsistent(t, fx, outs, 20)
}

// TestGroupCommitCancelled: a reservation whose context is cancelled while
// others are queued returns the context's error (bare when it was done
// before the call, wrapped in ErrUnavailable when it was not sent, in
// ErrOutcomeUnknown when a batch had taken it); the others complete.
func TestGroupCommitCancelled(t *testing.T) {
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, nil, etcdstore.Config{Clock: clock})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	s.SetCapacityPolicy(conformance.ActorLimit(100))
	reqs := make([]authority.ReserveRequest, 96)
	for i := range reqs {
		reqs[i] = fx.ReserveRequest(authority.ObjectActor, fmt.Sprintf("k%02d", i), conformance.TargetA)
	}
	// the odd requests are cancelled once the first batch is done, while
	// later ones are queued or in flight
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var once sync.Once
	firstDone := make(chan struct{})
	errs := make([]error, len(reqs))
	outs := make([]authority.ReserveResult, len(reqs))
	for i := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := context.Background()
			if i%2 == 1 {
				c = ctx
			}
			outs[i], errs[i] = s.Reserve(c, reqs[i])
			once.Do(func() { close(firstDone) })
		}()
	}
	<-firstDone
	cancel()
	wg.Wait()
	n := 0
	for i := range reqs {
		if i%2 == 0 {
			require.NoError(t, errs[i])
			require.Equal(t, authority.KindReserved, outs[i].Kind)
			n++
			continue
		}
		if errs[i] != nil {
			require.ErrorIs(t, errs[i], context.Canceled)
			// done before the call (the bare ctx.Err()), given up while
			// queued (not sent: ErrUnavailable) or while a batch had it
			// (ErrOutcomeUnknown)
			if errs[i] != context.Canceled && !errors.Is(errs[i], authority.ErrOutcomeUnknown) {
				require.ErrorIs(t, errs[i], authority.ErrUnavailable)
			}
			continue
		}
		require.Equal(t, authority.KindReserved, outs[i].Kind)
		n++
	}
	// whatever was reported reserved is there, and nothing else
	rows := fx.ListAll(authority.KindPrefix(authority.ObjectActor), 1000)
	require.GreaterOrEqual(t, len(rows), n)
	usage := fx.ActorUsage(conformance.NodeA)
	require.Equal(t, int64(len(rows)), usage.Reserved)
}

// TestGroupCommitQueuedCancelNotSent: a reservation given up while it waits
// behind its node's running batch was never sent: its error wraps both
// ErrUnavailable (safe to retry) and the context's error, and it wrote
// nothing.
func TestGroupCommitQueuedCancelNotSent(t *testing.T) {
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, nil, etcdstore.Config{Clock: clock})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	entered, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	s.SetCapacityPolicy(conformance.CapacityPolicyFunc(func(_ authority.NodeDescriptor, requested, reserved, active authority.CapacityVector) bool {
		if calls.Add(1) == 1 { // the first batch holds its node
			close(entered)
			<-release
		}
		return true
	}))
	first := make(chan error, 1)
	go func() {
		_, err := s.Reserve(context.Background(), fx.ReserveRequest(authority.ObjectActor, "first", conformance.TargetA))
		first <- err
	}()
	<-entered
	ctx, cancel := context.WithCancel(context.Background())
	queued := make(chan error, 1)
	go func() {
		_, err := s.Reserve(ctx, fx.ReserveRequest(authority.ObjectActor, "queued", conformance.TargetA))
		queued <- err
	}()
	// the second request waits behind the first batch (it cannot be taken
	// while the leader holds the node); cancel it there
	require.Eventually(t, func() bool {
		return etcdstore.QueuedReservations(s, conformance.NodeA, conformance.TargetA.NodeLifecycleGeneration) == 1
	}, 10*time.Second, time.Millisecond)
	cancel()
	err := <-queued
	close(release)
	require.NoError(t, <-first)
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, err, authority.ErrUnavailable)
	fx.RequireMissing(fx.Key(authority.ObjectActor, "queued"))
	require.Equal(t, int64(1), fx.ActorUsage(conformance.NodeA).Reserved)
}
