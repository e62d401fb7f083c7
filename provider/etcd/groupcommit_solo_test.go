package etcd_test

import (
	"bytes"
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
	"github.com/zlink-systems/authority/internal/etcdtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
)

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
