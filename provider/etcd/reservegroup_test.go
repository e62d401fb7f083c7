package etcd_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
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

// failingKV fails the commit of every Txn for which fail, given the Txn's
// Then ops, returns an error (without sending it); other Txns are sent.
type failingKV struct {
	clientv3.KV
	fail func(then []clientv3.Op) error
}

func (k failingKV) Txn(ctx context.Context) clientv3.Txn {
	return &failingTxn{Txn: k.KV.Txn(ctx), fail: k.fail}
}

type failingTxn struct {
	clientv3.Txn
	fail func(then []clientv3.Op) error
	then []clientv3.Op
}

func (t *failingTxn) If(cs ...clientv3.Cmp) clientv3.Txn   { t.Txn = t.Txn.If(cs...); return t }
func (t *failingTxn) Else(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Else(ops...); return t }
func (t *failingTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.then = append(t.then, ops...)
	t.Txn = t.Txn.Then(ops...)
	return t
}
func (t *failingTxn) Commit() (*clientv3.TxnResponse, error) {
	if err := t.fail(t.then); err != nil {
		return nil, err
	}
	return t.Txn.Commit()
}

// failNextPut fails the next Txn that puts once *armed is set, as if its
// reply was lost (context.DeadlineExceeded), and disarms.
func failNextPut(armed *atomic.Bool) func(then []clientv3.Op) error {
	return func(then []clientv3.Op) error {
		for _, op := range then {
			if op.IsPut() {
				if armed.CompareAndSwap(true, false) {
					return context.DeadlineExceeded
				}
				return nil
			}
		}
		return nil
	}
}

// Requests deferred or found exhausted in a round whose Txn failed with an
// unknown outcome were not in that Txn: their error is ErrUnavailable and
// does not match ErrOutcomeUnknown; the admitted one's outcome is unknown.
func TestGroupCommitDeferredOnTxnErrorIsNotUnknown(t *testing.T) {
	var fail atomic.Bool
	c := server.Client(t)
	c.KV = failingKV{KV: c.KV, fail: failNextPut(&fail)}
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, c, etcdstore.Config{Clock: clock})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	var calls atomic.Int64
	release, entered := make(chan struct{}), make(chan struct{})
	s.SetCapacityPolicy(conformance.CapacityPolicyFunc(func(_ authority.NodeDescriptor, _, _, _ authority.CapacityVector) bool {
		switch calls.Add(1) {
		case 1:
			close(entered)
			<-release
		case 2:
			fail.Store(true)
		case 3:
			return false // "full" is exhausted in the failing round
		}
		return true
	}))
	x := fx.ReserveRequest(authority.ObjectActor, "x", conformance.TargetA)
	a1 := fx.ReserveRequest(authority.ObjectActor, "dup", conformance.TargetA)
	a2 := fx.ReserveRequest(authority.ObjectActor, "dup", conformance.TargetA)
	var wg sync.WaitGroup
	full := fx.ReserveRequest(authority.ObjectActor, "full", conformance.TargetA)
	var err1, err2, err3 error
	wg.Go(func() { _, _ = s.Reserve(context.Background(), x) })
	<-entered
	wg.Go(func() { _, err1 = s.Reserve(context.Background(), a1) })
	waitQueued(t, s, 1)
	wg.Go(func() { _, err2 = s.Reserve(context.Background(), a2) })
	waitQueued(t, s, 2)
	wg.Go(func() { _, err3 = s.Reserve(context.Background(), full) })
	waitQueued(t, s, 3)
	close(release)
	wg.Wait()
	t.Logf("admitted: %v", err1)
	t.Logf("deferred: %v", err2)
	require.ErrorIs(t, err1, authority.ErrOutcomeUnknown)
	require.ErrorIs(t, err2, authority.ErrUnavailable)
	require.False(t, errors.Is(err2, authority.ErrOutcomeUnknown), "a request that was not in the Txn reports an unknown outcome")
	require.ErrorIs(t, err3, authority.ErrUnavailable)
	require.False(t, errors.Is(err3, authority.ErrOutcomeUnknown), "an exhausted request reports an unknown outcome")
}

// Under a capacity policy, a reservation whose own Txn fits the request
// limit but not together with its capacity fence and snapshot reads is
// refused with ErrLimitExceeded, not deferred round after round (the batch
// leader used to re-read until the caller's deadline, holding up every
// reservation of the node).
func TestGroupCommitRefusesWhatNeverFits(t *testing.T) {
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, nil, etcdstore.Config{Clock: clock, MaxRequestBytes: 64 * 1024})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	s.SetCapacityPolicy(conformance.ActorLimit(1000))
	reserved, refused := 0, 0
	for size := 64*1024 - 1800; size <= 64*1024; size += 20 { // the map fence keeps room (keepFenceRoom)
		req := fx.ReserveRequest(authority.ObjectActor, fmt.Sprintf("k%d", size), conformance.TargetA)
		req.CreatingPayload = bytes.Repeat([]byte{'x'}, size)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		out, err := s.Reserve(ctx, req)
		cancel()
		switch {
		case err == nil:
			require.Equal(t, authority.KindReserved, out.Kind, "payload %d", size)
			reserved++
		case errors.Is(err, authority.ErrLimitExceeded):
			require.Contains(t, err.Error(), "max-request-bytes")
			refused++
			key, kerr := req.Key.Encode()
			require.NoError(t, kerr)
			fx.RequireMissing(key)
		default:
			t.Fatalf("payload %d: neither reserved nor refused as too large: %v", size, err)
		}
	}
	require.Positive(t, reserved)
	require.Positive(t, refused)
	t.Logf("%d reserved, %d refused as too large", reserved, refused)
}

// A reservation that fits a Txn alone, but not with the reads of a whole
// batch of concurrent reservations, is decided alone in the next round:
// it and every concurrent reservation are reserved.
func TestGroupCommitDecidesABigReservationAlone(t *testing.T) {
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, nil, etcdstore.Config{Clock: clock, MaxRequestBytes: 64 * 1024})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	s.SetCapacityPolicy(conformance.ActorLimit(1000))
	// the largest payload that is reserved on its own
	big := 0
	for size := 64 * 1024; size > 60*1024 && big == 0; size -= 20 {
		req := fx.ReserveRequest(authority.ObjectActor, fmt.Sprintf("probe%d", size), conformance.TargetA)
		req.CreatingPayload = bytes.Repeat([]byte{'x'}, size)
		if out, err := s.Reserve(context.Background(), req); err == nil && out.Kind == authority.KindReserved {
			big = size
		}
	}
	require.Positive(t, big)
	for round := range 5 {
		var wg sync.WaitGroup
		errs := make([]error, 33)
		kinds := make([]authority.ResultKind, 33)
		reqs := make([]authority.ReserveRequest, 33) // the fixture is not safe for concurrent use
		for i := range reqs {
			reqs[i] = fx.ReserveRequest(authority.ObjectActor, fmt.Sprintf("r%d-%d", round, i), conformance.TargetA)
		}
		reqs[0].CreatingPayload = bytes.Repeat([]byte{'x'}, big)
		for i := range 33 {
			wg.Go(func() {
				req := reqs[i]
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				out, err := s.Reserve(ctx, req)
				errs[i], kinds[i] = err, out.Kind
			})
		}
		wg.Wait()
		for i := range 33 {
			require.NoError(t, errs[i], "round %d request %d", round, i)
			require.Equal(t, authority.KindReserved, kinds[i], "round %d request %d", round, i)
		}
	}
}

// soloSetup: a store with a 64 KiB request limit, the largest payload that
// reserves alone, and a policy that calls onCall(n) for the n-th decision
// once armed.
func soloSetup(t *testing.T, ns string) (*etcdstore.Store, *conformance.Fixture, int, *atomic.Bool, *atomic.Int64, *func(int64)) {
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, nil, etcdstore.Config{Clock: clock, MaxRequestBytes: 64 * 1024, Namespace: ns})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	var armed atomic.Bool
	var calls atomic.Int64
	hook := new(func(int64))
	s.SetCapacityPolicy(conformance.CapacityPolicyFunc(func(_ authority.NodeDescriptor, _, _, _ authority.CapacityVector) bool {
		if armed.Load() {
			(*hook)(calls.Add(1))
		}
		return true
	}))
	big := 0
	for size := 64 * 1024; size > 60*1024 && big == 0; size -= 20 {
		req := fx.ReserveRequest(authority.ObjectActor, fmt.Sprintf("probe%d", size), conformance.TargetA)
		req.CreatingPayload = bytes.Repeat([]byte{'x'}, size)
		if out, err := s.Reserve(context.Background(), req); err == nil && out.Kind == authority.KindReserved {
			big = size
		}
	}
	require.Positive(t, big)
	return s, fx, big, &armed, &calls, hook
}

func waitQueued(t *testing.T, s *etcdstore.Store, n int) {
	require.Eventually(t, func() bool {
		return etcdstore.QueuedReservations(s, conformance.NodeA, conformance.TargetA.NodeLifecycleGeneration) == n
	}, 10*time.Second, time.Millisecond)
}

// A solo request (one decided alone in its own round) whose caller gave up
// between rounds is not sent: no row is written, and its caller is told
// ErrUnavailable (it used to be brought back by the split and written).
func TestGroupCommitSoloGaveUpIsNotSent(t *testing.T) {
	s, fx, big, armed, _, hook := soloSetup(t, etcdtest.Namespace())
	x := fx.ReserveRequest(authority.ObjectActor, "x", conformance.TargetA)
	b := fx.ReserveRequest(authority.ObjectActor, "big", conformance.TargetA)
	b.CreatingPayload = bytes.Repeat([]byte{'x'}, big)
	s1 := fx.ReserveRequest(authority.ObjectActor, "dup", conformance.TargetA)
	s1b := fx.ReserveRequest(authority.ObjectActor, "dup", conformance.TargetA)
	bctx, bcancel := context.WithCancel(context.Background())
	defer bcancel()
	release := make(chan struct{})
	entered := make(chan struct{})
	*hook = func(n int64) {
		switch n {
		case 1: // x's batch holds the node while the others queue
			close(entered)
			<-release
		case 3: // s1, decided after big was made solo: big's caller gives up
			bcancel()
		}
	}
	armed.Store(true)
	var wg sync.WaitGroup
	var bout authority.ReserveResult
	var berr error
	wg.Go(func() { _, _ = s.Reserve(context.Background(), x) })
	<-entered
	wg.Go(func() { bout, berr = s.Reserve(bctx, b) })
	waitQueued(t, s, 1)
	wg.Go(func() { _, _ = s.Reserve(context.Background(), s1) })
	waitQueued(t, s, 2)
	wg.Go(func() { _, _ = s.Reserve(context.Background(), s1b) })
	waitQueued(t, s, 3)
	close(release)
	wg.Wait()
	t.Logf("big: out=%v err=%v", bout.Kind, berr)
	key, err := b.Key.Encode()
	require.NoError(t, err)
	rows := fx.ListAll(authority.KindPrefix(authority.ObjectActor), 100)
	found := false
	for _, r := range rows {
		if r.Key == key {
			found = true
		}
	}
	if found && errors.Is(berr, authority.ErrUnavailable) && !errors.Is(berr, authority.ErrOutcomeUnknown) {
		t.Fatalf("big was reserved (row %s exists) but its caller got ErrUnavailable (not applied): out=%v err=%v", key, bout.Kind, berr)
	}
	require.False(t, found && berr != nil, "row written after an error: %v", berr)
}

// The solo's caller giving up while its solo round is retried (after a
// conflicting write on the node) does not fail the live requests held for
// it: they are decided next.
func TestGroupCommitSoloGaveUpKeepsHeld(t *testing.T) {
	ns := etcdtest.Namespace()
	s, fx, big, armed, _, hook := soloSetup(t, ns)
	clock2 := authority.NewManualClock(testEpoch)
	s2 := newStore(t, nil, etcdstore.Config{Clock: clock2, Namespace: ns})
	x := fx.ReserveRequest(authority.ObjectActor, "x", conformance.TargetA)
	b := fx.ReserveRequest(authority.ObjectActor, "big", conformance.TargetA)
	b.CreatingPayload = bytes.Repeat([]byte{'x'}, big)
	s1 := fx.ReserveRequest(authority.ObjectActor, "dup", conformance.TargetA)
	s1b := fx.ReserveRequest(authority.ObjectActor, "dup", conformance.TargetA)
	other := fx.ReserveRequest(authority.ObjectActor, "other", conformance.TargetA)
	bctx, bcancel := context.WithCancel(context.Background())
	defer bcancel()
	release := make(chan struct{})
	entered := make(chan struct{})
	*hook = func(n int64) {
		switch n {
		case 1:
			close(entered)
			<-release
		case 4: // big, decided alone: another store moves the node's epoch, big's caller gives up
			out, err := s2.Reserve(context.Background(), other)
			if err != nil || out.Kind != authority.KindReserved {
				panic(fmt.Sprint("other: ", out.Kind, err))
			}
			bcancel()
		}
	}
	armed.Store(true)
	var wg sync.WaitGroup
	var heldOut authority.ReserveResult
	var heldErr, berr error
	wg.Go(func() { _, _ = s.Reserve(context.Background(), x) })
	<-entered
	wg.Go(func() { _, berr = s.Reserve(bctx, b) })
	waitQueued(t, s, 1)
	wg.Go(func() { _, _ = s.Reserve(context.Background(), s1) })
	waitQueued(t, s, 2)
	wg.Go(func() { heldOut, heldErr = s.Reserve(context.Background(), s1b) })
	waitQueued(t, s, 3)
	close(release)
	wg.Wait()
	t.Logf("big err=%v; held: out=%v err=%v", berr, heldOut.Kind, heldErr)
	require.NoError(t, heldErr, "a live request held for the solo failed because the solo's caller gave up")
}

// A solo admitted in the re-decision of its round after a Txn conflict (the
// Else layout is smaller) is decided once: its caller gets Reserved, not a
// refusal from a later round that read its own new row.
func TestGroupCommitSoloDecidedOnce(t *testing.T) {
	ns := etcdtest.Namespace()
	s, fx, big, armed, _, hook := soloSetup(t, ns)
	clock2 := authority.NewManualClock(testEpoch)
	s2 := newStore(t, nil, etcdstore.Config{Clock: clock2, Namespace: ns})
	long := fx.ReserveRequest(authority.ObjectActor, strings.Repeat("r", 900), conformance.TargetA)
	out, err := s.Reserve(context.Background(), long)
	require.NoError(t, err)
	require.Equal(t, authority.KindReserved, out.Kind)
	x := fx.ReserveRequest(authority.ObjectActor, "x", conformance.TargetA)
	b := fx.ReserveRequest(authority.ObjectActor, "big", conformance.TargetA)
	b.CreatingPayload = bytes.Repeat([]byte{'x'}, big-300)
	rAgain := fx.ReserveRequest(authority.ObjectActor, strings.Repeat("r", 900), conformance.TargetA)
	s1 := fx.ReserveRequest(authority.ObjectActor, "dup", conformance.TargetA)
	s1b := fx.ReserveRequest(authority.ObjectActor, "dup", conformance.TargetA)
	other := fx.ReserveRequest(authority.ObjectActor, "other", conformance.TargetA)
	release := make(chan struct{})
	entered := make(chan struct{})
	*hook = func(n int64) {
		switch n {
		case 1:
			close(entered)
			<-release
		case 3: // s1 in big's batch: another store moves the node's epoch
			out, err := s2.Reserve(context.Background(), other)
			if err != nil || out.Kind != authority.KindReserved {
				panic(fmt.Sprint("other: ", out.Kind, err))
			}
		}
	}
	armed.Store(true)
	var wg sync.WaitGroup
	var bout authority.ReserveResult
	var berr error
	wg.Go(func() { _, _ = s.Reserve(context.Background(), x) })
	<-entered
	wg.Go(func() { bout, berr = s.Reserve(context.Background(), b) })
	waitQueued(t, s, 1)
	wg.Go(func() { _, _ = s.Reserve(context.Background(), rAgain) })
	waitQueued(t, s, 2)
	wg.Go(func() { _, _ = s.Reserve(context.Background(), s1) })
	waitQueued(t, s, 3)
	wg.Go(func() { _, _ = s.Reserve(context.Background(), s1b) })
	waitQueued(t, s, 4)
	close(release)
	wg.Wait()
	key, err := b.Key.Encode()
	require.NoError(t, err)
	row := fx.MustRow(key)
	t.Logf("big: out=%v err=%v; row reservation=%v", bout.Kind, berr, row.PendingCreation != nil)
	require.NoError(t, berr)
	require.Equal(t, authority.KindReserved, bout.Kind, "big's own reservation was written but it was told %v", bout.Kind)
}
