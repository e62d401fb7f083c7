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
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// smallReceiveLimit is the receive (and send) limit of the client the paging
// tests give their store: a page of a few large rows exceeds it.
const smallReceiveLimit = 256 * 1024

// limitedStore returns a store on a client that refuses responses over
// smallReceiveLimit, with a fixture.
func limitedStore(t *testing.T, ns string) (*etcdstore.Store, *conformance.Fixture) {
	t.Helper()
	c := server.ClientWith(t, func(cfg *clientv3.Config) {
		cfg.MaxCallSendMsgSize, cfg.MaxCallRecvMsgSize = smallReceiveLimit, smallReceiveLimit
	})
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, c, etcdstore.Config{Clock: clock, Namespace: ns, SkipVersionCheck: ns != ""})
	return s, conformance.NewFixture(t, harnessFor(s, clock))
}

// TestListPagesOverReceiveLimit: a page of rows too large for the client's
// receive limit in one response is still a whole page (read in parts at the
// listing's revision), where it used to fail on every retry.
func TestListPagesOverReceiveLimit(t *testing.T) {
	s, fx := limitedStore(t, "")
	payload := bytes.Repeat([]byte("p"), 100*1024) // 5 rows: ≈ 500 KiB
	var keys []authority.Key
	for i := range 12 {
		snap := fx.Active(authority.ObjectUserSpot, fmt.Sprintf("big-%02d", i), conformance.TargetA)
		k := fx.Key(authority.ObjectUserSpot, fmt.Sprintf("big-%02d", i))
		fx.Put(k, snap.StoreVersion, payload)
		keys = append(keys, k)
	}
	ctx := context.Background()
	var got []authority.Key
	var sizes []int
	var cursor authority.ScanCursor
	for {
		res, err := s.ListAuthorities(ctx, "", cursor, 5)
		require.NoError(t, err)
		require.Equal(t, authority.KindPage, res.Kind)
		sizes = append(sizes, len(res.Items))
		for _, it := range res.Items {
			require.Equal(t, payload, it.Snapshot.Payload)
			got = append(got, it.Key)
		}
		if cursor = res.NextCursor; cursor == "" {
			break
		}
		// a write between pages is not in the listing's snapshot
		fx.Active(authority.ObjectUserSpot, fmt.Sprintf("late-%d", len(sizes)), conformance.TargetA)
	}
	require.Equal(t, []int{5, 5, 2}, sizes)
	require.Equal(t, keys, got)

	res, err := s.ListAuthorities(ctx, "", "", authority.MaxScanLimit)
	require.NoError(t, err)
	require.Len(t, res.Items, 12+2)
	require.Empty(t, res.NextCursor)
}

// TestRowOverReceiveLimit: a single row larger than the client's receive
// limit is ErrLimitExceeded naming that limit (not the server's request
// limit), for a read and for a listing.
func TestRowOverReceiveLimit(t *testing.T) {
	clock := authority.NewManualClock(testEpoch)
	writer := newStore(t, nil, etcdstore.Config{Clock: clock})
	wfx := conformance.NewFixture(t, harnessFor(writer, clock))
	snap := wfx.Active(authority.ObjectUserSpot, "huge", conformance.TargetA)
	key := wfx.Key(authority.ObjectUserSpot, "huge")
	wfx.Put(key, snap.StoreVersion, bytes.Repeat([]byte("h"), smallReceiveLimit+1))

	s, _ := limitedStore(t, writer.Namespace())
	ctx := context.Background()
	_, err := s.ReadAuthority(ctx, key)
	require.ErrorIs(t, err, authority.ErrLimitExceeded)
	require.ErrorContains(t, err, "receive limit")
	_, err = s.ListAuthorities(ctx, "", "", 10)
	require.ErrorIs(t, err, authority.ErrLimitExceeded)
	require.ErrorContains(t, err, "receive limit")
	require.False(t, errors.Is(err, authority.ErrUnavailable))
}

// TestCapacityReadsEveryPage: a node's capacity entries are read in pages;
// a store that has not watched the node counts every page, so the place
// the last entry takes is refused, and the usage it reports is whole.
func TestCapacityReadsEveryPage(t *testing.T) {
	etcdstore.SetCapacityPage(t, 4)
	stores, fxs := twoStores(t, conformance.ActorLimit(10))
	var held []conformance.Reservation
	for i := range 10 {
		held = append(held, fxs[0].Reserve(authority.ObjectActor, fmt.Sprintf("a-%d", i), conformance.TargetA))
	}
	require.Equal(t, 0, etcdstore.WatchedNodes(stores[1]))
	ctx := context.Background()
	res, err := stores[1].Reserve(ctx, fxs[1].ReserveRequest(authority.ObjectActor, "over", conformance.TargetA))
	require.NoError(t, err)
	require.Equal(t, authority.KindPlacementCapacityExhausted, res.Kind)
	etcdstore.CancelUsageWatches(stores[1])
	require.Eventually(t, func() bool { return etcdstore.WatchedNodes(stores[1]) == 0 }, 10*time.Second, time.Millisecond)
	require.Equal(t, authority.CapacityUsage{Reserved: 10}, fxs[1].ActorUsage(conformance.NodeA)) // the pages again

	abort(t, stores[0], held[3])
	// a failed watch makes the next decision read the pages again
	etcdstore.CancelUsageWatches(stores[1])
	fxs[1].Reserve(authority.ObjectActor, "fits", conformance.TargetA)
	res, err = stores[1].Reserve(ctx, fxs[1].ReserveRequest(authority.ObjectActor, "over-again", conformance.TargetA))
	require.NoError(t, err)
	require.Equal(t, authority.KindPlacementCapacityExhausted, res.Kind)
}

// TestGroupCommitSplitsReadsOverReceiveLimit: a batch of reservations whose
// existing rows do not fit one response of the client is decided in parts:
// each reservation gets its own outcome (the rows are there), where the
// whole batch used to fail with ErrLimitExceeded.
func TestGroupCommitSplitsReadsOverReceiveLimit(t *testing.T) {
	clock := authority.NewManualClock(testEpoch)
	writer := newStore(t, nil, etcdstore.Config{Clock: clock})
	wfx := conformance.NewFixture(t, harnessFor(writer, clock))
	const n = 6
	for i := range n {
		snap := wfx.Active(authority.ObjectActor, fmt.Sprintf("big-%d", i), conformance.TargetA)
		wfx.Put(wfx.Key(authority.ObjectActor, fmt.Sprintf("big-%d", i)), snap.StoreVersion, bytes.Repeat([]byte("b"), 100*1024))
	}

	s, fx := limitedStore(t, writer.Namespace())
	entered, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	s.SetCapacityPolicy(conformance.CapacityPolicyFunc(func(authority.NodeDescriptor, authority.CapacityVector, authority.CapacityVector, authority.CapacityVector) bool {
		if calls.Add(1) == 1 { // the first batch holds the node while the others queue
			close(entered)
			<-release
		}
		return true
	}))
	ctx := context.Background()
	first := make(chan error, 1)
	go func() {
		_, err := s.Reserve(ctx, fx.ReserveRequest(authority.ObjectActor, "first", conformance.TargetA))
		first <- err
	}()
	<-entered
	reqs := make([]authority.ReserveRequest, n)
	for i := range reqs {
		reqs[i] = fx.ReserveRequest(authority.ObjectActor, fmt.Sprintf("big-%d", i), conformance.TargetA)
	}
	results := make([]authority.ReserveResult, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { results[i], errs[i] = s.Reserve(ctx, reqs[i]) })
	}
	require.Eventually(t, func() bool {
		return etcdstore.QueuedReservations(s, conformance.NodeA, conformance.TargetA.NodeLifecycleGeneration) == n
	}, 10*time.Second, time.Millisecond)
	close(release)
	require.NoError(t, <-first)
	wg.Wait()
	for i := range n {
		require.NoError(t, errs[i], "reservation %d", i)
		require.Equal(t, authority.KindAlreadyExists, results[i].Kind, "reservation %d", i)
		require.Len(t, results[i].Current.Snapshot.Payload, 100*1024)
	}
}
