package reshard_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/capacitytest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/sharded"
	"github.com/zlink-systems/authority/provider/sharded/escrow"
	"github.com/zlink-systems/authority/provider/sharded/reshard"
)

// escrowRun counts what the writers of TestEscrowFollowsGrowth saw.
// holding is a lower bound of the actors NodeB holds over every shard: +1
// once a reservation is acknowledged, -1 before its abort is sent.
type escrowRun struct {
	holding, peak, admitted, exhausted, retried, duringJob atomic.Int64
	renumbered                                             atomic.Int64 // aborts sent again with the version read after the move
	jobRunning                                             atomic.Bool
	unexpected                                             atomic.Value

	mu   sync.Mutex
	held map[authority.Key]heldReservation // acknowledged, not aborted
}

type heldReservation struct {
	obj authority.ObjectKey
	res authority.ReserveResult
}

func (r *escrowRun) fail(err error) { r.unexpected.CompareAndSwap(nil, err.Error()) }

func (r *escrowRun) took(key authority.Key, obj authority.ObjectKey, res authority.ReserveResult) {
	r.mu.Lock()
	r.held[key] = heldReservation{obj, res}
	r.mu.Unlock()
	capacitytest.Took(&r.holding, &r.peak)
	r.admitted.Add(1)
	if r.jobRunning.Load() {
		r.duringJob.Add(1)
	}
}

// actorReservation is a valid reservation of an actor id on TargetB.
func actorReservation(id string) authority.ReserveRequest {
	return capacitytest.ActorReservation(id, conformance.TargetB)
}

// escrowWriter reserves actors on NodeB and aborts its own reservations.
type escrowWriter struct {
	id   int
	s    *sharded.Store
	fx   *conformance.Fixture
	rng  *rand.Rand
	run  *escrowRun
	seq  int
	mine []authority.Key
}

// reserve reserves one actor (true: the node was full).
func (w *escrowWriter) reserve(ctx context.Context) bool {
	w.seq++
	req := actorReservation(fmt.Sprintf("w%d-%d", w.id, w.seq))
	key := w.fx.Key(authority.ObjectActor, req.Key.GlobalID)
	res, err := w.s.Reserve(ctx, req)
	switch {
	case errors.Is(err, sharded.ErrCapacityNeedsEscrow):
		w.run.fail(fmt.Errorf("reserve %s: the store did not follow the map: %w", key, err))
	case errors.Is(err, authority.ErrUnavailable):
		w.run.retried.Add(1) // ErrMoving, contention, a map reload: retry later
	case err != nil:
		w.run.fail(fmt.Errorf("reserve %s: %w", key, err))
	case res.Kind == authority.KindReserved:
		w.run.took(key, req.Key, res)
		w.mine = append(w.mine, key)
	case res.Kind == authority.KindPlacementCapacityExhausted:
		w.run.exhausted.Add(1)
		return true
	default:
		w.run.fail(fmt.Errorf("reserve %s (shard %d of %d, job running %v): %s %+v", key, w.s.ShardOf(key), w.s.Shards(), w.run.jobRunning.Load(), res.Kind, res))
	}
	return false
}

// abort aborts one of the writer's reservations, retrying while its row is
// moving; it stops counting it before the abort is sent.
func (w *escrowWriter) abort(ctx context.Context) {
	if len(w.mine) == 0 {
		return
	}
	i := w.rng.IntN(len(w.mine))
	key := w.mine[i]
	w.mine = append(w.mine[:i], w.mine[i+1:]...)
	w.run.mu.Lock()
	h := w.run.held[key]
	delete(w.run.held, key)
	w.run.mu.Unlock()
	w.run.holding.Add(-1)
	req := authority.AbortRequest{Key: h.obj, ReservationID: h.res.ReservationID, ExpectedStoreVersion: h.res.Creating.StoreVersion, Target: conformance.TargetB}
	renumbered := false
	for ctx.Err() == nil {
		out, err := w.s.Abort(ctx, req)
		if errors.Is(err, authority.ErrUnavailable) && !errors.Is(err, sharded.ErrCapacityNeedsEscrow) {
			w.run.retried.Add(1)
			time.Sleep(time.Millisecond)
			continue
		}
		if err == nil && out.Kind == authority.KindStale && !renumbered {
			// the row moved: its version as the reservation gave it may
			// not match after the move (the lead's numbering fix of
			// moved rows); abort with the version read now
			renumbered = true
			w.run.renumbered.Add(1)
			r, rerr := w.s.ReadAuthority(ctx, key)
			if rerr == nil && r.Kind == authority.KindSnapshot {
				req.ExpectedStoreVersion = r.Snapshot.StoreVersion
				continue
			}
		}
		if err != nil || out.Kind != authority.KindAborted {
			w.run.fail(fmt.Errorf("abort %s (shard %d of %d, job running %v, reservation version %s): %v %v", key, w.s.ShardOf(key), w.s.Shards(), w.run.jobRunning.Load(), h.res.Creating.StoreVersion, out.Kind, err))
		}
		return
	}
}

// escrowLimit is NodeB's actor limit in TestEscrowFollowsGrowth.
const escrowLimit = 20

func nodeBLimit(limit int64) authority.CapacityPolicy {
	return conformance.CapacityPolicyFunc(func(node authority.NodeDescriptor, requested, reserved, active authority.CapacityVector) bool {
		return node != conformance.NodeB || requested.Actors+reserved.Actors+active.Actors <= limit
	})
}

// TestEscrowFollowsGrowth: two sharded stores (two processes, each with its
// own escrow mover) over two shards with a limit of 20 actors on NodeB;
// 8 writers reserve and abort actors on NodeB while the job grows the map
// to three shards, moving reservations (and their budget) into the new
// cluster. The actors NodeB holds never pass the limit, every acknowledged
// reservation reads back after the move and NodeB's usage equals them,
// and after a reclaim a reservation whose key lands in the new cluster is
// admitted: filling the node with keys of the new cluster only reaches
// exactly the limit (the sources' budget came back, the new cluster's
// slice grew).
func TestEscrowFollowsGrowth(t *testing.T) {
	const writers = 8
	ctx := t.Context()
	cs := clusters(t)
	policy := nodeBLimit(escrowLimit)
	var stores []*sharded.Store
	for range 2 {
		s, err := sharded.New(ctx, sharded.Config{Shards: cs[:2], Spares: cs[2:], Epoch: 2, CapacityPolicy: policy})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		stores = append(stores, s)
	}
	fx := conformance.NewFixture(t, harness(stores[0], nil))
	run := &escrowRun{held: map[authority.Key]heldReservation{}}
	var ws []*escrowWriter
	for i := range writers {
		ws = append(ws, &escrowWriter{id: i, s: stores[i%2], fx: fx, rng: rand.New(rand.NewPCG(uint64(i), 43)), run: run})
	}
	for full := false; !full; {
		full = ws[0].reserve(ctx) // fill NodeB: rows in both shards, a third of them to move
	}
	require.Nil(t, run.unexpected.Load())
	require.Equal(t, int64(escrowLimit), run.holding.Load(), "filled to the limit")

	stop := make(chan struct{})
	var wg sync.WaitGroup
	churn(&wg, ws, stop, reserveOrAbort(ctx))
	p := growWhileWriting(t, ctx, cs, 2, run)
	// the writers go on until both stores route by the grown map and
	// reservations were admitted in the new cluster (bounded)
	deadline := time.Now().Add(2 * time.Minute)
	for (stores[0].Shards() < 3 || stores[1].Shards() < 3 || newShardHeld(run, stores[0]) == 0) && time.Now().Before(deadline) && run.unexpected.Load() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	require.Nil(t, run.unexpected.Load())
	require.Equal(t, 3, stores[0].Shards())
	require.Equal(t, 3, stores[1].Shards())
	require.NotZero(t, run.duringJob.Load(), "writers were admitted while the job ran")
	require.NotZero(t, p.Rows, "rows moved")

	// every acknowledged reservation reads back; NodeB's usage is theirs
	held, over := requireHeldReadBack(t, run, stores[1], fx, "NodeB's actors over the three shards")
	u := fx.ActorUsage(conformance.NodeB)

	// budget followed: after a reclaim, keys of the old shards fill NodeB
	// to exactly the limit (the moved rows' usage is counted in the new
	// shard's slice, the sources' slack is back), and once one actor is
	// released, a key of the new shard takes its place
	releaser := &escrowWriter{s: stores[0], fx: fx, rng: rand.New(rand.NewPCG(7, 7)), run: run}
	release := func(keep func(authority.Key) bool, n int) {
		t.Helper()
		run.mu.Lock()
		releaser.mine = nil
		for key := range run.held {
			if !keep(key) {
				releaser.mine = append(releaser.mine, key)
			}
		}
		run.mu.Unlock()
		for range min(n, len(releaser.mine)) {
			releaser.abort(ctx)
		}
		require.Nil(t, run.unexpected.Load())
	}
	// room on the node, the moved rows kept in the new shard
	release(func(key authority.Key) bool { return stores[0].ShardOf(key) == 2 }, 6)
	heldMoved := newShardHeld(run, stores[0])
	_, err := stores[0].ReconcileEscrow(ctx, true)
	require.NoError(t, err)
	fill := func(shard int, prefix string) (admitted int) {
		t.Helper()
		for seq := 0; ; seq++ {
			req := actorReservation(fmt.Sprintf("%s-%d", prefix, seq))
			key := fx.Key(authority.ObjectActor, req.Key.GlobalID)
			if stores[1].ShardOf(key) != shard {
				continue
			}
			res, err := stores[1].Reserve(ctx, req)
			require.NoError(t, err)
			if res.Kind == authority.KindPlacementCapacityExhausted {
				return admitted
			}
			require.Equal(t, authority.KindReserved, res.Kind)
			run.took(key, req.Key, res)
			admitted++
		}
	}
	inOld := fill(0, "old0") + fill(1, "old1")
	u = fx.ActorUsage(conformance.NodeB)
	require.Equal(t, int64(escrowLimit), u.Active+u.Reserved, "the old shards fill NodeB to its limit, not past it")
	release(func(authority.Key) bool { return false }, 1)
	_, err = stores[0].ReconcileEscrow(ctx, true)
	require.NoError(t, err)
	inNew := fill(2, "new")
	require.Equal(t, 1, inNew, "a reservation in the new shard takes the released actor's place")
	u = fx.ActorUsage(conformance.NodeB)
	require.Equal(t, int64(escrowLimit), u.Active+u.Reserved)
	require.LessOrEqual(t, run.peak.Load(), int64(escrowLimit), "over-admitted")
	e0, e1 := stores[0].EscrowStats(), stores[1].EscrowStats()
	t.Logf("escrow-grow: from=2 to=3 limit=%d peak=%d over-admitted=%d moved=%d admitted=%d admitted-during-job=%d exhausted=%d unavailable=%d held-after=%d held-in-new-shard=%d filled-old=%d reserved-in-new-shard=ok (%d) grows=%d grants=%d aborts-renumbered=%d",
		escrowLimit, run.peak.Load(), over, p.Rows, run.admitted.Load(), run.duringJob.Load(), run.exhausted.Load(), run.retried.Load(), held, heldMoved, inOld, inNew,
		e0.Grows+e1.Grows, e0.Grants+e1.Grants, run.renumbered.Load())
}

// requireHeldReadBack requires every reservation run holds to read back
// through s, NodeB's usage to be theirs (usage names the shards in the
// message), within escrowLimit, and run's peak not over it; it returns how
// many run holds and by how much the peak passed the limit.
func requireHeldReadBack(t *testing.T, run *escrowRun, s *sharded.Store, fx *conformance.Fixture, usage string) (held int, over int64) {
	t.Helper()
	run.mu.Lock()
	held = len(run.held)
	for key := range run.held {
		r, err := s.ReadAuthority(t.Context(), key)
		require.NoError(t, err)
		require.Equal(t, authority.KindSnapshot, r.Kind, "acknowledged reservation %s reads back", key)
	}
	run.mu.Unlock()
	u := fx.ActorUsage(conformance.NodeB)
	require.Equal(t, int64(held), u.Active+u.Reserved, usage)
	require.LessOrEqual(t, held, escrowLimit)
	over = max(0, run.peak.Load()-escrowLimit)
	require.Zero(t, over, "over-admitted")
	return held, over
}

// newShardHeld counts the held reservations whose key is in shard 2.
func newShardHeld(run *escrowRun, s *sharded.Store) int {
	if s.Shards() < 3 {
		return 0
	}
	run.mu.Lock()
	defer run.mu.Unlock()
	n := 0
	for key := range run.held {
		if s.ShardOf(key) == 2 {
			n++
		}
	}
	return n
}

// TestEscrowHomeShardStaysAcrossGrowth: a node's escrow ledger is in shard
// HomeShard(node, 2) of a two-shard map, and stays there when the map
// grows to three (its Homes() stays 2): reservations admitted in every
// shard afterwards, the new one's included, find it there, no ledger is
// written anywhere else, and a reconcile finds every ledger in its home.
func TestEscrowHomeShardStaysAcrossGrowth(t *testing.T) {
	ctx := t.Context()
	cs := clusters(t)
	s, err := sharded.New(ctx, sharded.Config{Shards: cs[:2], Spares: cs[2:], Epoch: 2, CapacityPolicy: nodeBLimit(1000)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	fx := conformance.NewFixture(t, harness(s, nil))
	reserveIn := func(shard, n int, prefix string) {
		t.Helper()
		for seq, got := 0, 0; got < n; seq++ {
			req := actorReservation(fmt.Sprintf("%s-%d", prefix, seq))
			if s.ShardOf(fx.Key(authority.ObjectActor, req.Key.GlobalID)) != shard {
				continue
			}
			res, err := s.Reserve(ctx, req)
			require.NoError(t, err)
			require.Equal(t, authority.KindReserved, res.Kind)
			got++
		}
	}
	reserveIn(0, 3, "before0")
	reserveIn(1, 3, "before1")
	home := escrow.HomeShard(conformance.NodeB, 2)
	requireLedgerOnlyIn(t, cs, home)

	grow(t, cs, 2, nil)
	require.Eventually(t, func() bool { return s.Shards() == 3 }, time.Minute, 10*time.Millisecond)
	fx.SetLive(conformance.TargetB, true) // in the new cluster too
	k, err := etcdMapKeys(ctx, cs[2])
	require.NoError(t, err)
	require.Equal(t, 2, k.Homes(), "the grown map keeps the home shard count")
	for shard := range 3 {
		reserveIn(shard, 2, fmt.Sprintf("after%d", shard))
	}
	requireLedgerOnlyIn(t, cs, home)
	_, err = s.ReconcileEscrow(ctx, true)
	require.NoError(t, err, "every ledger is in its home shard")
	u := fx.ActorUsage(conformance.NodeB)
	require.Equal(t, int64(12), u.Active+u.Reserved)
}

// requireLedgerOnlyIn requires NodeB's ledgers to be in cluster home only.
func requireLedgerOnlyIn(t *testing.T, cs []etcdstore.Config, home int) {
	t.Helper()
	for i, c := range cs {
		l := schema.NewLayout(c.Namespace)
		resp, err := c.Client.Get(context.Background(), l.BudgetLedgersPrefix(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
		require.NoError(t, err)
		if i == home {
			require.Len(t, resp.Kvs, 1, "NodeB's ledger in its home shard %d", home)
		} else {
			require.Empty(t, resp.Kvs, "no ledger in shard %d (home %d)", i, home)
		}
	}
}

// etcdMapKeys reads the map in force in a cluster.
func etcdMapKeys(ctx context.Context, c etcdstore.Config) (schema.ShardMap, error) {
	st, err := etcdstore.New(ctx, etcdstore.Config{Client: c.Client, Namespace: c.Namespace, ReadOnly: true})
	if err != nil {
		return schema.ShardMap{}, err
	}
	defer func() { _ = st.Close() }()
	k, err := st.Moves().ReadMap(ctx)
	if err != nil || k.Current == nil {
		return schema.ShardMap{}, errors.Join(err, errors.New("no map in force"))
	}
	return *k.Current, nil
}

// markLiveIn marks TargetB's owner live in cluster c (the harness marked it
// in the clusters of the map before the move; a store marks it in a
// cluster a move adds only when asked again).
func markLiveIn(t *testing.T, c etcdstore.Config) {
	st, err := etcdstore.New(context.Background(), etcdstore.Config{Client: c.Client, Namespace: c.Namespace, ShardMapFence: true})
	if err != nil {
		t.Errorf("open the new cluster: %v", err)
		return
	}
	t.Cleanup(func() { _ = st.Close() }) // its close ends the liveness lease
	b := conformance.TargetB
	if err := st.MarkLive(context.Background(), b.Descriptor(), b.NodeLifecycleGeneration, b.Owner, 10*time.Minute); err != nil {
		t.Errorf("mark TargetB live in the new cluster: %v", err)
	}
}

// TestOneShardStoreTakesPolicyAfterGrowth: a store opened over one shard
// with Spares and no policy runs capacity escrow, so once its map grew to
// two it takes a capacity policy, which then holds over both shards: NodeB
// takes exactly the limit, with reservations in each shard.
func TestOneShardStoreTakesPolicyAfterGrowth(t *testing.T) {
	ctx := t.Context()
	cs := clusters(t)
	s, err := sharded.New(ctx, sharded.Config{Shards: cs[:1], Spares: cs[1:2]})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	fx := conformance.NewFixture(t, harness(s, nil))
	for i := range 2 {
		res, err := s.Reserve(ctx, actorReservation(fmt.Sprintf("before-%d", i)))
		require.NoError(t, err)
		require.Equal(t, authority.KindReserved, res.Kind)
	}
	grow(t, cs, 1, func(c *reshard.Config) { c.LeaseWait = 100 * time.Millisecond })
	require.Eventually(t, func() bool { return s.Shards() == 2 }, time.Minute, 10*time.Millisecond)
	fx.SetLive(conformance.TargetB, true) // in the new cluster too
	require.NoError(t, s.SetCapacityPolicy(ctx, nodeBLimit(5)))
	run := &escrowRun{held: map[authority.Key]heldReservation{}}
	in1 := fillShard(t, s, fx, run, 1, "after1")
	in0 := fillShard(t, s, fx, run, 0, "after0")
	require.Equal(t, 3, in0+in1, "the limit of 5 over both shards, 2 held before")
	require.NotZero(t, in1, "admitted in the new shard")
	u := fx.ActorUsage(conformance.NodeB)
	require.Equal(t, int64(5), u.Active+u.Reserved)
}

// churn runs step for every writer of ws, each in a loop of its own in wg,
// until stop closes.
func churn[W any](wg *sync.WaitGroup, ws []W, stop <-chan struct{}, step func(W)) {
	for _, w := range ws {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				step(w)
			}
		})
	}
}

// reserveOrAbort is a churning escrow writer's step: a reservation or an
// abort, at even odds.
func reserveOrAbort(ctx context.Context) func(*escrowWriter) {
	return func(w *escrowWriter) {
		if w.rng.IntN(2) == 0 {
			w.reserve(ctx)
		} else {
			w.abort(ctx)
		}
	}
}

// growWhileWriting grows the map of cs[:n] by cs[n] to its end while run's
// writers write (run.jobRunning set meanwhile), marking the nodes live in
// the new cluster once the job catches up.
func growWhileWriting(t *testing.T, ctx context.Context, cs []etcdstore.Config, n int, run *escrowRun) reshard.Progress {
	t.Helper()
	run.jobRunning.Store(true)
	defer run.jobRunning.Store(false)
	var live sync.Once
	p, err := reshard.Run(ctx, reshard.Config{Shards: cs[:n], Add: cs[n], LeaseWait: 5 * time.Second, AggregateWait: time.Second,
		Step: func(step string) {
			if step == "catching up" {
				live.Do(func() { markLiveIn(t, cs[n]) })
			}
		}})
	require.NoError(t, err, "resharding: %v", p)
	require.Equal(t, schema.PhaseDone, p.Phase)
	return p
}
