package etcd_test

import (
	"context"
	"fmt"
	"math/rand/v2"
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

// twoStores returns two stores on one namespace, each with a fixture, both
// under policy.
func twoStores(t *testing.T, policy authority.CapacityPolicy) ([2]*etcdstore.Store, [2]*conformance.Fixture) {
	t.Helper()
	clock := authority.NewManualClock(testEpoch)
	s1 := newStore(t, nil, etcdstore.Config{Clock: clock})
	s2 := newStore(t, nil, etcdstore.Config{Clock: clock, Namespace: s1.Namespace(), SkipVersionCheck: true})
	stores := [2]*etcdstore.Store{s1, s2}
	var fxs [2]*conformance.Fixture
	for i, s := range stores {
		s.SetCapacityPolicy(policy)
		fxs[i] = conformance.NewFixture(t, harnessFor(s, clock))
	}
	return stores, fxs
}

func abort(t *testing.T, s *etcdstore.Store, r conformance.Reservation) {
	t.Helper()
	res, err := s.Abort(context.Background(), authority.AbortRequest{
		Key: r.Req.Key, ReservationID: r.Res.ReservationID, ExpectedStoreVersion: r.Res.Creating.StoreVersion, Target: r.Req.Target,
	})
	require.NoError(t, err)
	require.Equal(t, authority.KindAborted, res.Kind)
}

// TestWatchedUsageSeesOtherStores: a store decides on its watched usage of
// the node, and every capacity change another store made before a
// reservation started counts in it: room freed by the other store's abort is
// admitted at once, room it took is refused at once.
func TestWatchedUsageSeesOtherStores(t *testing.T) {
	stores, fxs := twoStores(t, conformance.ActorLimit(1))
	ctx := context.Background()
	held := fxs[0].Reserve(authority.ObjectActor, "first", conformance.TargetA)
	holder := 0
	for i := range 40 {
		other := 1 - holder
		res, err := stores[other].Reserve(ctx, fxs[other].ReserveRequest(authority.ObjectActor, fmt.Sprintf("refused-%d", i), conformance.TargetA))
		require.NoError(t, err)
		require.Equal(t, authority.KindPlacementCapacityExhausted, res.Kind, "round %d: store %d holds the only place", i, holder)
		abort(t, stores[holder], held)
		held = fxs[other].Reserve(authority.ObjectActor, fmt.Sprintf("taken-%d", i), conformance.TargetA)
		holder = other
	}
	require.Equal(t, 1, etcdstore.WatchedNodes(stores[0]))
	require.Equal(t, 1, etcdstore.WatchedNodes(stores[1]))
}

// TestWatchedUsageMatchesEntries: after random reservations, commits,
// completions, aborts, deletes, aggregate moves and owner removals from two
// stores on two nodes, each store's watched usage equals the sum of the
// capacity entries, and every capacity change touched its node's epoch at
// its revision (and no epoch moved without one).
func TestWatchedUsageMatchesEntries(t *testing.T) {
	stores, fxs := twoStores(t, conformance.ActorLimit(12))
	ctx := context.Background()
	ns := stores[0].Namespace()
	start, err := shared.Get(ctx, ns+"start")
	require.NoError(t, err)
	rng := rand.New(rand.NewPCG(7, 11))
	targets := []authority.CreationTarget{conformance.TargetA, conformance.TargetB}
	type open struct {
		r     conformance.Reservation
		store int
	}
	var reserved []open
	var active []authority.Key
	for i := range 300 {
		si := rng.IntN(2)
		s, fx := stores[si], fxs[si]
		switch op := rng.IntN(10); {
		case op < 4: // reserve an Actor or a Spot
			kind := authority.ObjectActor
			if rng.IntN(3) == 0 {
				kind = authority.ObjectUserSpot
			}
			req := fx.ReserveRequest(kind, fmt.Sprintf("k%d", i), targets[rng.IntN(2)])
			res, err := s.Reserve(ctx, req)
			require.NoError(t, err)
			if res.Kind == authority.KindReserved {
				key, err := authority.EncodeKey(req.Key.Kind, req.Key.GlobalID)
				require.NoError(t, err)
				reserved = append(reserved, open{conformance.Reservation{Req: req, Res: res, Key: key}, si})
			} else {
				require.Equal(t, authority.KindPlacementCapacityExhausted, res.Kind)
			}
		case op < 6 && len(reserved) > 0: // finish one
			j := rng.IntN(len(reserved))
			o := reserved[j]
			reserved = append(reserved[:j], reserved[j+1:]...)
			switch {
			case rng.IntN(3) == 0:
				abort(t, s, o.r)
			case o.r.Req.Key.Kind == authority.ObjectActor:
				fx.MustComplete(o.r, authority.TerminalCreated, []byte("ready"), fxs[0].Publication()) // one counter of operations
				active = append(active, o.r.Key)
			default:
				fx.MustCommit(o.r, []byte("ready"))
				active = append(active, o.r.Key)
			}
		case op < 8 && len(active) > 0: // delete an active row
			j := rng.IntN(len(active))
			key := active[j]
			active = append(active[:j], active[j+1:]...)
			row := fx.MustRow(key)
			res, err := s.CompareExchangeAuthority(ctx, key, row.StoreVersion, authority.Delete())
			require.NoError(t, err)
			require.Equal(t, authority.KindDeleted, res.Kind)
		case op == 9 && len(active) > 0: // move an active row of node A to node B
			key := active[rng.IntN(len(active))]
			row := fx.MustRow(key)
			if row.Allocation.Descriptor != conformance.NodeA {
				continue
			}
			req := conformance.AggregateRequest(fmt.Sprintf("move-%d", i), 1, conformance.TargetB, row.Allocation.Capacity,
				conformance.Participant(key, row.StoreVersion, authority.TransitionNewOwner, []byte("moved")))
			prep, err := s.PrepareAggregate(ctx, req)
			require.NoError(t, err)
			if prep.Kind != authority.KindPrepared {
				require.Equal(t, authority.KindConflict, prep.Kind) // node B is full
				continue
			}
			if rng.IntN(3) == 0 {
				res, err := s.AbortAggregate(ctx, prep.Fence)
				require.NoError(t, err)
				require.Equal(t, authority.KindAborted, res.Kind)
				continue
			}
			res, err := s.CommitAggregate(ctx, prep.Fence)
			require.NoError(t, err)
			require.Equal(t, authority.KindCommitted, res.Kind)
		case op == 8 && rng.IntN(4) == 0: // remove the owner of node B's rows
			_, err := s.RemoveAllByOwner(ctx, conformance.TargetB.Owner)
			require.NoError(t, err)
			reserved = slicesDeleteFunc(reserved, func(o open) bool { return o.r.Req.Target == conformance.TargetB })
			var kept []authority.Key
			for _, k := range active {
				if fx.Read(k).Kind == authority.KindSnapshot {
					kept = append(kept, k)
				}
			}
			active = kept
		}
	}
	requireEpochsTouched(t, ns, start.Header.Revision)
	for _, node := range []authority.NodeDescriptor{conformance.NodeA, conformance.NodeB} {
		for _, kind := range []authority.ObjectKind{authority.ObjectActor, authority.ObjectUserSpot} {
			want, err := stores[0].CapacityUsage(ctx, node, conformance.NodeLifecycle, kind, conformance.DefaultStableType)
			require.NoError(t, err)
			for i, s := range stores {
				got, ok, err := etcdstore.WatchedUsage(ctx, s, node, conformance.NodeLifecycle, kind, conformance.DefaultStableType)
				require.NoError(t, err)
				require.True(t, ok, "store %d watches node %s", i, node.RID)
				require.Equal(t, want, got, "store %d, node %s, %s", i, node.RID, kind)
			}
		}
	}
}

// requireEpochsTouched replays the capacity entries' and epochs' changes
// under ns since rev: each node lifecycle's entries changed exactly at the
// revisions its epoch was put.
func requireEpochsTouched(t *testing.T, ns string, rev int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	end := ns + "capacity~end" // under the watched prefix, in neither layout segment
	_, err := shared.Put(ctx, end, "")
	require.NoError(t, err)
	entries, epochs := map[string][]int64{}, map[string][]int64{}
	add := func(m map[string][]int64, node string, rev int64) {
		if l := m[node]; len(l) == 0 || l[len(l)-1] != rev {
			m[node] = append(l, rev)
		}
	}
	changes := 0
	for wr := range shared.Watch(ctx, ns+"capacity", clientv3.WithPrefix(), clientv3.WithRev(rev+1)) {
		require.NoError(t, wr.Err())
		for _, ev := range wr.Events {
			k := strings.TrimPrefix(string(ev.Kv.Key), ns)
			switch {
			case k == "capacity~end":
				require.NotZero(t, changes, "no capacity change to check")
				require.Equal(t, entries, epochs)
				return
			case strings.HasPrefix(k, "capacity-epochs/"):
				add(epochs, strings.TrimPrefix(k, "capacity-epochs/"), ev.Kv.ModRevision)
			case strings.HasPrefix(k, "capacity/"):
				parts := strings.SplitN(strings.TrimPrefix(k, "capacity/"), "/", 4)
				require.Len(t, parts, 4, k)
				add(entries, strings.Join(parts[:3], "/"), ev.Kv.ModRevision)
				changes++
			}
		}
	}
	t.Fatal("watch ended before the end marker")
}

func slicesDeleteFunc[T any](s []T, del func(T) bool) []T {
	out := s[:0]
	for _, x := range s {
		if !del(x) {
			out = append(out, x)
		}
	}
	return out
}

// rangeSpyKV counts the Txns of a client that read or compare a range.
type rangeSpyKV struct {
	clientv3.KV
	ranges *atomic.Int64
}

func (k rangeSpyKV) Txn(ctx context.Context) clientv3.Txn {
	return rangeSpyTxn{k.KV.Txn(ctx), k.ranges}
}

type rangeSpyTxn struct {
	clientv3.Txn
	ranges *atomic.Int64
}

func (t rangeSpyTxn) If(cs ...clientv3.Cmp) clientv3.Txn {
	for _, c := range cs {
		if len(c.GetCompare().RangeEnd) > 0 {
			t.ranges.Add(1)
		}
	}
	return rangeSpyTxn{t.Txn.If(cs...), t.ranges}
}

func (t rangeSpyTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.count(ops)
	return rangeSpyTxn{t.Txn.Then(ops...), t.ranges}
}

func (t rangeSpyTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.count(ops)
	return rangeSpyTxn{t.Txn.Else(ops...), t.ranges}
}

func (t rangeSpyTxn) count(ops []clientv3.Op) {
	for _, op := range ops {
		if len(op.RangeBytes()) > 0 {
			t.ranges.Add(1)
		}
	}
}

// rangeSpiedStore returns a store whose Txns with a range are counted, and a
// fixture over it.
func rangeSpiedStore(t *testing.T) (*etcdstore.Store, *conformance.Fixture, *atomic.Int64) {
	t.Helper()
	ranges := &atomic.Int64{}
	c := server.Client(t)
	c.KV = rangeSpyKV{c.KV, ranges}
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, c, etcdstore.Config{Clock: clock})
	ranges.Store(0) // New's read of the store version is not a reservation's
	return s, conformance.NewFixture(t, harnessFor(s, clock)), ranges
}

// TestWatchedUsageNoRangePerReservation: once a node's usage is watched,
// reservations on it (admitted, refused or in conflict) neither read nor
// compare its capacity range, however many entries it holds.
func TestWatchedUsageNoRangePerReservation(t *testing.T) {
	s, fx, ranges := rangeSpiedStore(t)
	for i := range 50 {
		fx.Active(authority.ObjectActor, fmt.Sprintf("held-%d", i), conformance.TargetA)
	}
	s.SetCapacityPolicy(conformance.ActorLimit(60))
	fx.Reserve(authority.ObjectActor, "first", conformance.TargetA) // reads the range once
	require.EqualValues(t, 1, ranges.Load())
	ranges.Store(0)
	var reqs []authority.ReserveRequest
	for i := range 20 {
		reqs = append(reqs, fx.ReserveRequest(authority.ObjectActor, fmt.Sprintf("more-%d", i), conformance.TargetA))
	}
	reqs = append(reqs, fx.ReserveRequest(authority.ObjectActor, "held-3", conformance.TargetA))
	outs, errs := reserveAll([]*etcdstore.Store{s}, reqs)
	require.Equal(t, map[authority.ResultKind]int{authority.KindReserved: 9, authority.KindPlacementCapacityExhausted: 11,
		authority.KindAlreadyExists: 1}, kinds(t, outs, errs))
	require.Zero(t, ranges.Load(), "Txns with a range")
	fx.RequireUsage(conformance.NodeA, authority.ObjectActor, "", 50, 10)
}

// TestCapacityUsageWatchesTheNode: CapacityUsage on a node nobody watches
// sums its range once and starts its watch, as a reservation does; the
// reservations and usage reads after it on that node read no range. (It
// read the range on every call and left the node unwatched, so TestScale's
// warm-up did nothing and the timed reservations paid one read of each of
// the 100 nodes' 9k entries at 1M rows: 159 pairs/s.)
func TestCapacityUsageWatchesTheNode(t *testing.T) {
	s, fx, ranges := rangeSpiedStore(t)
	for i := range 5 {
		fx.Active(authority.ObjectActor, fmt.Sprintf("held-%d", i), conformance.TargetA)
	}
	s.SetCapacityPolicy(conformance.ActorLimit(10))
	ranges.Store(0)
	fx.RequireUsage(conformance.NodeA, authority.ObjectActor, "", 5, 0)
	require.EqualValues(t, 1, ranges.Load(), "the first usage read sums the range")
	require.Equal(t, 1, etcdstore.WatchedNodes(s))
	fx.Reserve(authority.ObjectActor, "next", conformance.TargetA)
	fx.RequireUsage(conformance.NodeA, authority.ObjectActor, "", 5, 1)
	require.EqualValues(t, 1, ranges.Load(), "Txns with a range after the first")
	require.EqualValues(t, 1, etcdstore.CapacityRangeReads(s))
}

// TestWatchedUsageRecoversFromFailedWatch: when a node's watch ends (as on
// a compaction past it or a lost leader), the next reservation reads the
// range again, decides exactly, and watches anew.
func TestWatchedUsageRecoversFromFailedWatch(t *testing.T) {
	s, fx, ranges := rangeSpiedStore(t)
	s.SetCapacityPolicy(conformance.ActorLimit(3))
	fx.Reserve(authority.ObjectActor, "a", conformance.TargetA)
	require.Equal(t, 1, etcdstore.WatchedNodes(s))
	etcdstore.CancelUsageWatches(s)
	require.Eventually(t, func() bool { return etcdstore.WatchedNodes(s) == 0 }, 10*time.Second, time.Millisecond)
	// changes while nothing watches
	s.SetCapacityPolicy(nil)
	fx.Active(authority.ObjectActor, "b", conformance.TargetA)
	s.SetCapacityPolicy(conformance.ActorLimit(3))
	ranges.Store(0)
	fx.Reserve(authority.ObjectActor, "c", conformance.TargetA)
	require.EqualValues(t, 1, ranges.Load(), "the range is read again once")
	require.Equal(t, 1, etcdstore.WatchedNodes(s))
	res, err := s.Reserve(context.Background(), fx.ReserveRequest(authority.ObjectActor, "d", conformance.TargetA))
	require.NoError(t, err)
	require.Equal(t, authority.KindPlacementCapacityExhausted, res.Kind)
	require.EqualValues(t, 1, ranges.Load())
}

// TestWatchedUsageStalledWatch: a watch that does not catch up with a read's
// epoch within its bound is dropped; the decision reads the range instead
// and stays exact.
func TestWatchedUsageStalledWatch(t *testing.T) {
	s, fx, ranges := rangeSpiedStore(t)
	s.SetCapacityPolicy(conformance.ActorLimit(2))
	fx.Reserve(authority.ObjectActor, "a", conformance.TargetA)
	// the epoch moves, and the watch sees no change of the range that would
	// take it there: from the decision's side, a watch that fell behind
	_, err := shared.Put(context.Background(), s.Namespace()+"capacity-epochs/mesh-1/node-a/1", "")
	require.NoError(t, err)
	ranges.Store(0)
	fx.Reserve(authority.ObjectActor, "b", conformance.TargetA)
	require.EqualValues(t, 1, ranges.Load(), "the range read once the watch is given up")
	require.Equal(t, 1, etcdstore.WatchedNodes(s))
	started, _ := etcdstore.UsageWatchCounts(s)
	require.EqualValues(t, 2, started, "the stalled watch was replaced")
	res, err := s.Reserve(context.Background(), fx.ReserveRequest(authority.ObjectActor, "c", conformance.TargetA))
	require.NoError(t, err)
	require.Equal(t, authority.KindPlacementCapacityExhausted, res.Kind)
	require.EqualValues(t, 1, ranges.Load(), "watched again")
}

// TestWatchedUsageIdleWatchCloses: a node's watch ends once no decision used
// it for the idle time, and comes back with the next one.
func TestWatchedUsageIdleWatchCloses(t *testing.T) {
	etcdstore.SetUsageWatchIdle(t, 50*time.Millisecond)
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, nil, etcdstore.Config{Clock: clock})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	s.SetCapacityPolicy(conformance.ActorLimit(10))
	// Counted by starts, not by the watches open when Reserve returns: on a
	// slow cluster the idle time can pass between the decision and the
	// return (CI's TLS cluster did).
	fx.Reserve(authority.ObjectActor, "a", conformance.TargetA)
	started, _ := etcdstore.UsageWatchCounts(s)
	require.EqualValues(t, 1, started, "the first decision starts the node's watch")
	require.Eventually(t, func() bool { return etcdstore.WatchedNodes(s) == 0 }, 10*time.Second, 5*time.Millisecond)
	fx.Reserve(authority.ObjectActor, "b", conformance.TargetA)
	started, _ = etcdstore.UsageWatchCounts(s)
	require.EqualValues(t, 2, started, "the next decision starts it again")
	fx.RequireUsage(conformance.NodeA, authority.ObjectActor, "", 0, 2)
}

// TestWatchedUsageEndsWithStore: Close stops a store's usage watches, also
// on a client that outlives the store.
func TestWatchedUsageEndsWithStore(t *testing.T) {
	clock := authority.NewManualClock(testEpoch)
	s, err := etcdstore.New(context.Background(), etcdstore.Config{Client: shared, Namespace: etcdtest.Namespace(), Clock: clock})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = s.Close()
		_, _ = shared.Delete(context.Background(), s.Namespace(), clientv3.WithPrefix())
	})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	s.SetCapacityPolicy(conformance.ActorLimit(10))
	fx.Reserve(authority.ObjectActor, "a", conformance.TargetA)
	fx.Reserve(authority.ObjectActor, "b", conformance.TargetB)
	started, running := etcdstore.UsageWatchCounts(s)
	require.EqualValues(t, 2, started)
	require.EqualValues(t, 2, running)
	require.NoError(t, s.Close())
	_, running = etcdstore.UsageWatchCounts(s)
	require.Zero(t, running, "watch followers left after Close")
	require.Zero(t, etcdstore.WatchedNodes(s))
}

// TestBatchedWritesTouchEpochs: capacity changes sent merged by the write
// batcher (one Txn slot, 16 writers) still put each changed node's epoch at
// their revision.
func TestBatchedWritesTouchEpochs(t *testing.T) {
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, nil, etcdstore.Config{Clock: clock, MaxConcurrentTxns: 1})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	ctx := context.Background()
	start, err := shared.Get(ctx, s.Namespace()+"start")
	require.NoError(t, err)
	before := s.WriteStats()
	const writers, each = 16, 8
	var reqs [writers][each]authority.ReserveRequest // the fixture is not safe for concurrent use
	for w := range writers {
		for i := range each {
			tgt := []authority.CreationTarget{conformance.TargetA, conformance.TargetB}[w%2]
			reqs[w][i] = fx.ReserveRequest(authority.ObjectUserSpot, fmt.Sprintf("w%d-%d", w, i), tgt)
		}
	}
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				req := reqs[w][i]
				res, err := s.Reserve(ctx, req)
				if err != nil || res.Kind != authority.KindReserved {
					t.Errorf("reserve: %v %v", res.Kind, err)
					return
				}
				key, _ := authority.EncodeKey(req.Key.Kind, req.Key.GlobalID)
				r := conformance.Reservation{Req: req, Res: res, Key: key}
				if i%2 == 0 {
					_, err = s.Commit(ctx, r.CommitRequest([]byte("ready")))
				} else {
					_, err = s.Abort(ctx, r.AbortRequest())
				}
				if err != nil {
					t.Errorf("finish: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	st := s.WriteStats()
	require.NotZero(t, st.BatchedWrites-before.BatchedWrites, "no write was sent merged: the test tests nothing")
	requireEpochsTouched(t, s.Namespace(), start.Header.Revision)
}

// TestFencedPreparesAreNotMerged: aggregate prepares fenced on one node's
// capacity epoch, sent concurrently through one Txn slot, are each decided
// alone: the target never holds more than its limit (10 rounds: a merge of
// two prepares that read the same epoch needs them to meet in the queue).
func TestFencedPreparesAreNotMerged(t *testing.T) {
	for round := range 10 {
		fencedPreparesRound(t, round)
	}
}

func fencedPreparesRound(t *testing.T, round int) {
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, nil, etcdstore.Config{Clock: clock, MaxConcurrentTxns: 1})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	ctx := context.Background()
	const moves, limit = 12, 3
	reqs := make([]authority.AggregatePrepareRequest, moves)
	for i := range reqs {
		row := fx.Active(authority.ObjectActor, fmt.Sprintf("a%d", i), conformance.TargetA)
		reqs[i] = conformance.AggregateRequest(fmt.Sprintf("move-%d", i), 1, conformance.TargetB, row.Allocation.Capacity,
			conformance.Participant(fx.Key(authority.ObjectActor, fmt.Sprintf("a%d", i)), row.StoreVersion, authority.TransitionNewOwner, nil))
	}
	s.SetCapacityPolicy(conformance.CapacityPolicyFunc(func(node authority.NodeDescriptor, requested, reserved, active authority.CapacityVector) bool {
		return node != conformance.NodeB || reserved.Actors+active.Actors+requested.Actors <= limit
	}))
	var wg sync.WaitGroup
	outs := make([]authority.ResultKind, moves)
	for i := range reqs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := s.PrepareAggregate(ctx, reqs[i])
			if err != nil {
				t.Errorf("round %d: prepare %d: %v", round, i, err)
			}
			outs[i] = res.Kind
		}()
	}
	wg.Wait()
	got := map[authority.ResultKind]int{}
	for _, k := range outs {
		got[k]++
	}
	require.Equal(t, map[authority.ResultKind]int{authority.KindPrepared: limit, authority.KindConflict: moves - limit}, got, "round %d", round)
	fx.RequireUsage(conformance.NodeB, authority.ObjectActor, "", 0, limit)
}
