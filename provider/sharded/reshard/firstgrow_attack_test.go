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

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/sharded"
	"github.com/zlink-systems/authority/provider/sharded/reshard"
)

// Attacks on the first growth of a store running capacity escrow over one
// shard (Config.Spares): the true-up of capacity placed without escrow
// (trueup.go), a policy lowered below the usage, a job stopped after the
// true-up and run again.

var actorCounter = schema.BudgetCounter{Kind: authority.ObjectActor}

// budgetOf reads NodeB's budget slice (and usage) in cluster c and its
// ledger there, through a read-only store.
func budgetOf(t *testing.T, c etcdstore.Config) (etcdstore.SliceState, schema.BudgetLedger) {
	t.Helper()
	st, err := etcdstore.New(context.Background(), etcdstore.Config{Client: c.Client, Namespace: c.Namespace, ReadOnly: true})
	require.NoError(t, err)
	defer func() { _ = st.Close() }()
	sl, err := st.Budget().Slice(context.Background(), conformance.NodeB, conformance.NodeLifecycle)
	require.NoError(t, err)
	led, err := st.Budget().Ledger(context.Background(), conformance.NodeB, conformance.NodeLifecycle)
	require.NoError(t, err)
	return sl, led
}

// requireSane requires NodeB's slices in cs to be within the ledger's
// figures and to hold their usage (a cover never left a slice short of
// the usage it saw, nothing negative), and returns the actors granted
// (the ledger's Given minus Taken over every shard).
func requireSane(t *testing.T, cs []etcdstore.Config, n int) int64 {
	t.Helper()
	_, led := budgetOf(t, cs[0])
	var granted int64
	for i := range n {
		sl, _ := budgetOf(t, cs[i])
		for _, b := range []schema.Budget{sl.Slice.Received, sl.Slice.Returned, sl.Slice.Size(), sl.Usage} {
			for c, v := range b {
				require.GreaterOrEqual(t, v, int64(0), "shard %d counter %v", i, c)
			}
		}
		line := led.Shards[i]
		require.True(t, line.Given.Covers(sl.Slice.Received), "shard %d received %v beyond the ledger's %v", i, sl.Slice.Received, line.Given)
		require.True(t, line.Given.Covers(line.Taken), "shard %d: taken %v beyond given %v", i, line.Taken, line.Given)
		require.True(t, sl.Slice.Size().Covers(sl.Usage), "shard %d: slice %v short of its usage %v", i, sl.Slice.Size(), sl.Usage)
		granted += line.Given[actorCounter] - line.Taken[actorCounter]
	}
	return granted
}

// growWithLive grows cs[:1] by cs[1], marking TargetB live in cs[1] once
// the job copies.
func growWithLive(t *testing.T, cs []etcdstore.Config, edit func(*reshard.Config)) {
	t.Helper()
	grow(t, cs, 1, func(c *reshard.Config) {
		c.LeaseWait = 100 * time.Millisecond
		c.Step = func(step string) {
			if step == "catching up" {
				markLiveIn(t, cs[1])
			}
		}
		if edit != nil {
			edit(c)
		}
	})
}

// TestFirstGrowthUnderPolicyBelowUsage: over one cluster NodeB holds 20
// actors (one placed with escrow, 19 without, beyond its slice) when its
// policy is lowered to 10, and the cluster grows 1 → 2. The switch covers
// the 20 without asking the policy (nothing negative, no slice short of
// its usage); nothing is admitted in either shard while NodeB holds 10 or
// more, released one at a time, each release followed by a reclaim (a
// shard re-admits on its own usage the budget a release freed in its
// slice until a reclaim returns it: docs/deviations.md B3); at 9, exactly
// one is admitted, and the node ends at the limit.
func TestFirstGrowthUnderPolicyBelowUsage(t *testing.T) {
	const before, lowered = 20, 10
	ctx := t.Context()
	cs := clusters(t)
	s, plain, fx, run, w := firstGrowthStores(t, cs, nodeBLimit(before), 5)
	var placed atomic.Int64
	plainWriter(ctx, plain, fx, run, "plain", &placed, before, nil)
	require.NoError(t, plain.Close())
	require.Nil(t, run.unexpected.Load())
	require.Equal(t, int64(before), run.holding.Load())
	require.NoError(t, s.SetCapacityPolicy(ctx, nodeBLimit(lowered)))
	require.True(t, w.reserve(ctx), "refused over one shard above the lowered limit")

	growWithLive(t, cs, nil)
	require.Eventually(t, func() bool { return s.Shards() == 2 }, time.Minute, 10*time.Millisecond)
	granted := requireSane(t, cs, 2)
	require.GreaterOrEqual(t, granted, int64(before), "the switch covered NodeB's usage")

	w.mine = w.mine[:0]
	for key := range run.held {
		w.mine = append(w.mine, key)
	}
	for held := before; held >= lowered; held-- {
		require.Zero(t, fillShard(t, s, fx, run, 1, fmt.Sprintf("new-%d", held)), "admitted in the new shard with %d held, limit %d", held, lowered)
		require.Zero(t, fillShard(t, s, fx, run, 0, fmt.Sprintf("old-%d", held)), "admitted in the first shard with %d held, limit %d", held, lowered)
		requireSane(t, cs, 2)
		w.abort(ctx)
		require.Nil(t, run.unexpected.Load())
		// the released actor's budget is slack in its shard's slice, which
		// that shard admits on its own usage until a reclaim returns it
		// (docs/deviations.md B3)
		_, err := s.ReconcileEscrow(ctx, true)
		require.NoError(t, err)
	}
	require.Equal(t, 1, fillShard(t, s, fx, run, 1, "last-new")+fillShard(t, s, fx, run, 0, "last-old"))
	u := fx.ActorUsage(conformance.NodeB)
	require.Equal(t, int64(lowered), u.Active+u.Reserved)
	requireSane(t, cs, 2)
}

// TestTrueUpRunTwiceCoversOnce: over one cluster NodeB's escrow slice
// holds 8 actors, its usage 13 (5 placed without escrow), and its ledger
// a grant of 3 more whose receipt was lost (Given 11). A job stopped once
// the switch's true-up ran (before it decided the switch) covered the
// slice exactly to the usage (the lost grant received, 2 granted); run
// again, its true-up grants nothing more; after the growth NodeB fills to
// exactly its limit of 20 over both shards.
func TestTrueUpRunTwiceCoversOnce(t *testing.T) {
	const limit = 20
	ctx := t.Context()
	cs := clusters(t)
	s, plain, fx, run, _ := firstGrowthStores(t, cs, nodeBLimit(limit), 6)
	sl, _ := budgetOf(t, cs[0])
	chunk := sl.Slice.Size()[actorCounter]
	require.Less(t, chunk, int64(limit-3), "the slice took a chunk, not the limit")
	var placed atomic.Int64
	plainWriter(ctx, plain, fx, run, "plain", &placed, chunk+4, nil)
	require.NoError(t, plain.Close())
	require.Nil(t, run.unexpected.Load())
	usage := 1 + chunk + 4
	// a grant of 3 whose receipt was lost (a mover stopped between the
	// ledger's grant and the slice's receipt)
	lost, err := etcdstore.New(ctx, etcdstore.Config{Client: cs[0].Client, Namespace: cs[0].Namespace, ShardMapFence: true})
	require.NoError(t, err)
	_, err = lost.Budget().Grant(ctx, conformance.NodeB, conformance.NodeLifecycle, 0, authority.CapacityVector{Actors: 3})
	require.NoError(t, err)
	require.NoError(t, lost.Close())

	jctx, cancel := context.WithCancel(ctx)
	cfg := jobConfig(cs, 1)
	cfg.LeaseWait = 100 * time.Millisecond
	cfg.Step = func(step string) {
		switch step {
		case "catching up":
			markLiveIn(t, cs[1])
		case "deciding the switch":
			cancel() // the true-up ran; the decision's write is not sent
		}
	}
	_, err = reshard.Run(jctx, cfg)
	require.ErrorIs(t, err, context.Canceled)
	sl, led := budgetOf(t, cs[0])
	require.Equal(t, usage, sl.Usage[actorCounter])
	require.Equal(t, usage, sl.Slice.Size()[actorCounter], "the true-up covered the slice to the usage")
	require.Equal(t, usage, led.Shards[0].Given[actorCounter], "the lost grant counted, the rest granted once")

	cfg.Step = nil
	p, err := reshard.Run(ctx, cfg)
	require.NoError(t, err, "resumed: %v", p)
	require.Equal(t, schema.PhaseDone, p.Phase)
	require.Eventually(t, func() bool { return s.Shards() == 2 }, time.Minute, 10*time.Millisecond)
	require.Equal(t, usage, requireSane(t, cs, 2), "run twice, the true-up granted once")
	in := fillShard(t, s, fx, run, 1, "new") + fillShard(t, s, fx, run, 0, "old")
	require.Equal(t, int(limit-usage), in)
	u := fx.ActorUsage(conformance.NodeB)
	require.Equal(t, int64(limit), u.Active+u.Reserved)
}

// deadlineWriter reserves actors on NodeB through s, each under a short
// deadline, sends each that failed again without one (adopting it when the
// first attempt was written), and aborts some of its own.
type deadlineWriter struct {
	*escrowWriter
	found, again int      // failed reservations found written / written by the retry
	unavailable  int      // failed with ErrUnavailable (the others: outcome unknown or the deadline)
	notApplied   []string // found written though their error said not applied
}

// reserveShort reserves one actor under a deadline of 20µs..8ms.
func (w *deadlineWriter) reserveShort(ctx context.Context) {
	w.seq++
	req := actorReservation(fmt.Sprintf("d%d-%d", w.id, w.seq))
	key := w.fx.Key(authority.ObjectActor, req.Key.GlobalID)
	sctx, cancel := context.WithTimeout(ctx, time.Duration(20+w.rng.IntN(8000))*time.Microsecond)
	res, err := w.s.Reserve(sctx, req)
	cancel()
	switch {
	case err == nil:
		w.settle(key, req, res, nil)
	case errors.Is(err, authority.ErrUnavailable) || errors.Is(err, authority.ErrOutcomeUnknown) ||
		errors.Is(err, context.DeadlineExceeded):
		w.run.retried.Add(1)
		if errors.Is(err, authority.ErrUnavailable) {
			w.unavailable++
		}
		w.retry(ctx, key, req, err)
	default:
		w.run.fail(fmt.Errorf("reserve %s under a short deadline: untyped error %w", key, err))
	}
}

// retry sends req again without a deadline (while the row moves, again):
// either it is written now or the first attempt's row is in the way.
func (w *deadlineWriter) retry(ctx context.Context, key authority.Key, req authority.ReserveRequest, first error) {
	for attempt := 0; ; attempt++ {
		res, err := w.s.Reserve(ctx, req)
		if errors.Is(err, authority.ErrUnavailable) && attempt < 1000 {
			time.Sleep(2 * time.Millisecond)
			continue
		}
		if err != nil {
			w.run.fail(fmt.Errorf("reserve %s again: %w", key, err))
			return
		}
		w.settle(key, req, res, first)
		return
	}
}

// settle records the outcome of a reservation (first: the error of an
// earlier attempt of it).
func (w *deadlineWriter) settle(key authority.Key, req authority.ReserveRequest, res authority.ReserveResult, first error) {
	switch {
	case res.Kind == authority.KindReserved:
		if first != nil {
			w.again++
		}
		w.run.took(key, req.Key, res)
		w.mine = append(w.mine, key)
	case res.Kind == authority.KindPlacementCapacityExhausted:
		w.run.exhausted.Add(1)
	case first != nil && res.Kind == authority.KindConflict && res.Current.Snapshot != nil &&
		res.Current.Snapshot.PendingCreation != nil && res.Current.Snapshot.PendingCreation.RequestContentReference == req.Intent.RequestContentReference:
		// the attempt that failed was written: its reserved row is in
		// the way; the writer holds it
		w.found++
		if !errors.Is(first, authority.ErrOutcomeUnknown) {
			w.notApplied = append(w.notApplied, fmt.Sprintf("%s: %v", key, first))
		}
		snap := *res.Current.Snapshot
		w.run.took(key, req.Key, authority.ReserveResult{Kind: authority.KindReserved, ReservationID: snap.PendingCreation.ReservationID, Creating: &snap})
		w.mine = append(w.mine, key)
	default:
		w.run.fail(fmt.Errorf("reserve %s (failed before: %v): %s", key, first, res.Kind))
	}
}

// TestShortDeadlinesThroughFirstGrowth: 4 writers reserve actors on NodeB
// through a store over one cluster with Spares (limit 16), each Reserve
// under a deadline of 20µs..8ms, and abort some of theirs, while the
// cluster grows 1 → 2 and until the store routes by the grown map and
// holds one in the new shard. Every error is typed (ErrUnavailable,
// ErrOutcomeUnknown or the deadline); each reservation that failed, sent
// again without a deadline, is either written now or found written (its
// reserved row in the way: conflict), and found written only if its error
// was ErrOutcomeUnknown or the deadline (ErrUnavailable: not applied).
// Nothing is half-written: NodeB's usage is exactly the rows held, never
// above the limit, and its budget is sane.
func TestShortDeadlinesThroughFirstGrowth(t *testing.T) {
	const limit, writers = 16, 4
	ctx := t.Context()
	cs := clusters(t)
	s, err := sharded.New(ctx, sharded.Config{Shards: cs[:1], Spares: cs[1:2], CapacityPolicy: nodeBLimit(limit)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	fx := conformance.NewFixture(t, harness(s, nil))
	run := &escrowRun{held: map[authority.Key]heldReservation{}}
	var ws []*deadlineWriter
	for i := range writers {
		ws = append(ws, &deadlineWriter{escrowWriter: &escrowWriter{id: i, s: s, fx: fx, rng: rand.New(rand.NewPCG(uint64(i), 45)), run: run}})
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	churn(&wg, ws, stop, func(w *deadlineWriter) {
		if w.rng.IntN(3) == 0 {
			w.abort(ctx)
		} else {
			w.reserveShort(ctx)
		}
	})
	var duringJob atomic.Int64
	cfg := jobConfig(cs, 1)
	cfg.LeaseWait = 100 * time.Millisecond
	cfg.Step = func(step string) {
		if step == "catching up" {
			markLiveIn(t, cs[1])
		}
		duringJob.Store(run.retried.Load())
	}
	run.jobRunning.Store(true)
	p, err := reshard.Run(ctx, cfg)
	run.jobRunning.Store(false)
	require.NoError(t, err, "resharding: %v", p)
	deadline := time.Now().Add(2 * time.Minute)
	for (s.Shards() < 2 || heldIn(run, s, 1) == 0 || run.retried.Load() < 20) && time.Now().Before(deadline) && run.unexpected.Load() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	require.Nil(t, run.unexpected.Load())
	require.Equal(t, 2, s.Shards())
	require.NotZero(t, duringJob.Load(), "deadlines ran out while the job ran")
	require.NotZero(t, heldIn(run, s, 1), "held in the new shard")
	found, again, unavailable := 0, 0, 0
	var notApplied []string
	for _, w := range ws {
		found, again, unavailable, notApplied = found+w.found, again+w.again, unavailable+w.unavailable, append(notApplied, w.notApplied...)
	}
	require.Empty(t, notApplied, "reservations written though they failed with ErrUnavailable (not applied)")
	u := fx.ActorUsage(conformance.NodeB)
	require.Equal(t, int64(len(run.held)), u.Active+u.Reserved, "NodeB's usage is the rows held")
	require.LessOrEqual(t, run.peak.Load(), int64(limit))
	requireSane(t, cs, 2)
	t.Logf("short-deadlines-first-growth: limit=%d admitted=%d deadline-errors=%d unavailable=%d during-job=%d found-written=%d written-again=%d held=%d held-in-new-shard=%d exhausted=%d",
		limit, run.admitted.Load(), run.retried.Load(), unavailable, duringJob.Load(), found, again, len(run.held), heldIn(run, s, 1), run.exhausted.Load())
}

// closeSteps are the steps of the first growth at which
// TestCloseThroughFirstGrowth closes a store.
var closeSteps = []string{"freezing shard 0", "covering capacity placed without escrow", "deciding the switch",
	"switching the new cluster", "switching shard 0", "moving the capacity budgets of the moved rows"}

// TestCloseThroughFirstGrowth: six stores over one cluster with Spares
// (capacity escrow, limit 24 on NodeB), each with a writer reserving and
// aborting actors on NodeB; the job grows the cluster 1 → 2 and closes
// one store at each of six steps around the switch (the freeze, the
// true-up, the decision, each flip, the budgets' move), while its writer
// runs. Each Close returns (within a minute: no hang) and no Reserve that
// began after it returned is acknowledged (ErrClosed); the job finishes,
// NodeB's usage is the reservations acknowledged, within the limit, and
// (TestMain) no goroutine is left.
func TestCloseThroughFirstGrowth(t *testing.T) {
	const limit = 24
	ctx := t.Context()
	cs := clusters(t)
	n := len(closeSteps)
	stores := make([]*sharded.Store, n)
	for i := range stores {
		var err error
		stores[i], err = sharded.New(ctx, sharded.Config{Shards: cs[:1], Spares: cs[1:2], CapacityPolicy: nodeBLimit(limit)})
		require.NoError(t, err)
		t.Cleanup(func() { _ = stores[i].Close() })
	}
	// TargetB's owner is marked live through a store not closed (a store's
	// close ends the liveness it marked)
	live, err := sharded.New(ctx, sharded.Config{Shards: cs[:1], Spares: cs[1:2], CapacityPolicy: nodeBLimit(limit)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = live.Close() })
	fx := conformance.NewFixture(t, harness(live, nil))
	run := &escrowRun{held: map[authority.Key]heldReservation{}}
	closing := make([]atomic.Bool, n) // set before Close is called
	closed := make([]atomic.Bool, n)  // set once Close returned
	var afterClose atomic.Int64       // Reserves begun after Close returned and answered ErrClosed
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, s := range stores {
		w := &escrowWriter{id: i, s: s, fx: fx, rng: rand.New(rand.NewPCG(uint64(i), 46)), run: run}
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if closed[i].Load() {
					w.seq++
					req := actorReservation(fmt.Sprintf("closed%d-%d", i, w.seq))
					res, err := s.Reserve(ctx, req)
					if !errors.Is(err, authority.ErrClosed) {
						run.fail(fmt.Errorf("store %d closed: reserve answered %v %v", i, res.Kind, err))
					}
					afterClose.Add(1)
					time.Sleep(time.Millisecond)
					continue
				}
				if w.rng.IntN(2) == 0 {
					w.reserveOpen(ctx, &closing[i])
				} else {
					w.abortOpen(ctx)
				}
			}
		})
	}
	cfg := jobConfig(cs, 1)
	cfg.LeaseWait = 100 * time.Millisecond
	var at atomic.Int64
	cfg.Step = func(step string) {
		if step == "catching up" {
			markLiveIn(t, cs[1])
		}
		k := int(at.Load())
		if k >= n || step != closeSteps[k] {
			return
		}
		at.Add(1)
		closing[k].Store(true)
		done := make(chan error, 1)
		go func() { done <- stores[k].Close() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("close store %d at %q: %v", k, step, err)
			}
		case <-time.After(time.Minute):
			t.Errorf("close store %d at %q: still running after a minute", k, step)
			<-done
		}
		closed[k].Store(true)
	}
	p, err := reshard.Run(ctx, cfg)
	require.NoError(t, err, "resharding: %v", p)
	require.Equal(t, n, int(at.Load()), "a store was closed at every step")
	// the writers of the closed stores go on until each answered ErrClosed
	deadline := time.Now().Add(time.Minute)
	for afterClose.Load() < int64(2*n) && time.Now().Before(deadline) && run.unexpected.Load() == nil {
		time.Sleep(5 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	require.Nil(t, run.unexpected.Load())
	require.GreaterOrEqual(t, afterClose.Load(), int64(2*n))
	require.Eventually(t, func() bool { return live.Shards() == 2 }, time.Minute, 10*time.Millisecond)
	run.mu.Lock()
	held := len(run.held)
	run.mu.Unlock()
	var sum int64
	for i := range 2 {
		sl, _ := budgetOf(t, cs[i])
		sum += sl.Usage[actorCounter]
	}
	require.Equal(t, int64(held), sum, "NodeB's usage is the reservations acknowledged")
	require.LessOrEqual(t, run.peak.Load(), int64(limit))
	t.Logf("close-first-growth: closed=%d admitted=%d held=%d exhausted=%d unavailable=%d refused-after-close=%d moved=%d",
		n, run.admitted.Load(), held, run.exhausted.Load(), run.retried.Load(), afterClose.Load(), p.Rows)
}

// reserveOpen is escrowWriter.reserve for a writer whose store may close:
// ErrClosed once closing is set.
func (w *escrowWriter) reserveOpen(ctx context.Context, closing *atomic.Bool) {
	w.seq++
	req := actorReservation(fmt.Sprintf("w%d-%d", w.id, w.seq))
	key := w.fx.Key(authority.ObjectActor, req.Key.GlobalID)
	res, err := w.s.Reserve(ctx, req)
	switch {
	case errors.Is(err, authority.ErrClosed) && closing.Load(),
		errors.Is(err, authority.ErrUnavailable) && !errors.Is(err, sharded.ErrCapacityNeedsEscrow):
		w.run.retried.Add(1)
		time.Sleep(time.Millisecond)
	case err != nil:
		w.run.fail(fmt.Errorf("reserve %s: %w", key, err))
	case res.Kind == authority.KindReserved:
		w.run.took(key, req.Key, res)
		w.mine = append(w.mine, key)
	case res.Kind == authority.KindPlacementCapacityExhausted:
		w.run.exhausted.Add(1)
	default:
		w.run.fail(fmt.Errorf("reserve %s: %s", key, res.Kind))
	}
}

// abortOpen is escrowWriter.abort for a writer whose store may close: an
// abort that fails with ErrClosed leaves the reservation held.
func (w *escrowWriter) abortOpen(ctx context.Context) {
	if len(w.mine) == 0 {
		return
	}
	key := w.mine[len(w.mine)-1]
	w.run.mu.Lock()
	h := w.run.held[key]
	w.run.mu.Unlock()
	req := authority.AbortRequest{Key: h.obj, ReservationID: h.res.ReservationID, ExpectedStoreVersion: h.res.Creating.StoreVersion, Target: conformance.TargetB}
	out, err := w.s.Abort(ctx, req)
	switch {
	case errors.Is(err, authority.ErrClosed), errors.Is(err, authority.ErrUnavailable):
		w.run.retried.Add(1)
		time.Sleep(time.Millisecond)
	case err == nil && out.Kind == authority.KindAborted:
		w.mine = w.mine[:len(w.mine)-1]
		w.run.mu.Lock()
		delete(w.run.held, key)
		w.run.mu.Unlock()
		w.run.holding.Add(-1)
	case err == nil && out.Kind == authority.KindStale:
		w.mine = w.mine[:len(w.mine)-1] // moved: renumbered (TestEscrowFollowsFirstGrowth aborts those)
	default:
		w.run.fail(fmt.Errorf("abort %s: %v %v", key, out.Kind, err))
	}
}

// TestFirstGrowthAbortedAfterTrueUp: over one cluster NodeB holds one
// actor placed with escrow (its slice takes a chunk) and more placed
// without (beyond the slice). A job stopped after the switch's true-up
// covered them is aborted: the slice holds the usage, the ledger agrees,
// the escrow store admits over one shard and the store without escrow
// places again (beyond the slice once more). The next growth's true-up
// covers those too: NodeB then fills to exactly its limit over both
// shards.
func TestFirstGrowthAbortedAfterTrueUp(t *testing.T) {
	const limit = 40
	ctx := t.Context()
	cs := clusters(t)
	s, err := sharded.New(ctx, sharded.Config{Shards: cs[:1], Spares: cs[1:2], CapacityPolicy: nodeBLimit(limit)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	plain, err := sharded.New(ctx, sharded.Config{Shards: cs[:1], CapacityPolicy: nodeBLimit(limit)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = plain.Close() })
	fx := conformance.NewFixture(t, harness(s, nil))
	run := &escrowRun{held: map[authority.Key]heldReservation{}}
	w := &escrowWriter{s: s, fx: fx, rng: rand.New(rand.NewPCG(8, 8)), run: run}
	require.False(t, w.reserve(ctx))
	sl, _ := budgetOf(t, cs[0])
	chunk := sl.Slice.Size()[actorCounter]
	var placed atomic.Int64
	plainWriter(ctx, plain, fx, run, "plain-a", &placed, chunk+3, nil)
	require.Nil(t, run.unexpected.Load())

	jctx, cancel := context.WithCancel(ctx)
	cfg := jobConfig(cs, 1)
	cfg.LeaseWait = 100 * time.Millisecond
	cfg.Step = func(step string) {
		switch step {
		case "catching up":
			markLiveIn(t, cs[1])
		case "deciding the switch":
			cancel()
		}
	}
	_, err = reshard.Run(jctx, cfg)
	require.ErrorIs(t, err, context.Canceled)
	p, err := reshard.Abort(ctx, jobConfig(cs, 1))
	require.NoError(t, err)
	require.Equal(t, schema.PhaseAborted, p.Phase)
	require.Equal(t, run.holding.Load(), requireSane(t, cs, 1), "the true-up covered NodeB's usage, once")
	sl, _ = budgetOf(t, cs[0])
	require.Equal(t, run.holding.Load(), sl.Slice.Size()[actorCounter])

	// over one shard again: the store without escrow places (after it
	// reads the map again), the escrow store admits (a grow), and the
	// store without escrow places beyond the slice
	pctx, pcancel := context.WithTimeout(ctx, time.Minute) // ErrUnavailable until it reads the map again
	plainWriter(pctx, plain, fx, run, "plain-b", &placed, chunk+6, nil)
	pcancel()
	require.Nil(t, run.unexpected.Load())
	require.Equal(t, chunk+6, placed.Load())
	require.False(t, w.reserve(ctx))
	sl, _ = budgetOf(t, cs[0])
	plainWriter(ctx, plain, fx, run, "plain-c", &placed, placed.Load()+sl.Slice.Size()[actorCounter]-sl.Usage[actorCounter]+3, nil)
	require.Nil(t, run.unexpected.Load())
	sl, _ = budgetOf(t, cs[0])
	require.Greater(t, sl.Usage[actorCounter], sl.Slice.Size()[actorCounter], "placed beyond the slice again")
	require.NoError(t, plain.Close())

	growWithLive(t, cs, nil)
	require.Eventually(t, func() bool { return s.Shards() == 2 }, time.Minute, 10*time.Millisecond)
	held := run.holding.Load()
	require.Equal(t, held, requireSane(t, cs, 2), "the second true-up covered the usage placed after the abort")
	in := fillShard(t, s, fx, run, 1, "new") + fillShard(t, s, fx, run, 0, "old")
	require.Equal(t, int(limit-held), in)
	u := fx.ActorUsage(conformance.NodeB)
	require.Equal(t, int64(limit), u.Active+u.Reserved)
}

// reserveIn reserves n actors on NodeB whose keys are in shard i through
// s and returns how many were admitted.
func reserveIn(t *testing.T, s *sharded.Store, fx *conformance.Fixture, run *escrowRun, i, n int, prefix string) (admitted int) {
	t.Helper()
	for seq, tried := 0, 0; tried < n; seq++ {
		req := actorReservation(fmt.Sprintf("%s-%d", prefix, seq))
		key := fx.Key(authority.ObjectActor, req.Key.GlobalID)
		if s.ShardOf(key) != i {
			continue
		}
		tried++
		res, err := s.Reserve(t.Context(), req)
		require.NoError(t, err)
		if res.Kind == authority.KindReserved {
			run.took(key, req.Key, res)
			admitted++
			continue
		}
		require.Equal(t, authority.KindPlacementCapacityExhausted, res.Kind)
	}
	return admitted
}

// TestRemovedPolicyStaysRemovedAcrossFirstGrowth: a store opened over one
// cluster with Spares and a policy of 2 actors on NodeB is given no policy
// (SetCapacityPolicy nil) and places 6 there; after the growth 1 → 2 it
// still has none, in the new shard too: 6 more in each shard are admitted.
// (The cluster the growth added was opened with the configured policy and
// kept it: the new shard refused from its third actor on.)
func TestRemovedPolicyStaysRemovedAcrossFirstGrowth(t *testing.T) {
	ctx := t.Context()
	cs := clusters(t)
	s, err := sharded.New(ctx, sharded.Config{Shards: cs[:1], Spares: cs[1:2], CapacityPolicy: nodeBLimit(2)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	fx := conformance.NewFixture(t, harness(s, nil))
	run := &escrowRun{held: map[authority.Key]heldReservation{}}
	require.NoError(t, s.SetCapacityPolicy(ctx, nil))
	require.Equal(t, 6, reserveIn(t, s, fx, run, 0, 6, "before"))
	growWithLive(t, cs, nil)
	require.Eventually(t, func() bool { return s.Shards() == 2 }, time.Minute, 10*time.Millisecond)
	require.Equal(t, 6, reserveIn(t, s, fx, run, 1, 6, "new"), "admitted in the new shard without a policy")
	require.Equal(t, 6, reserveIn(t, s, fx, run, 0, 6, "old"), "admitted in the first shard without a policy")
	u := fx.ActorUsage(conformance.NodeB)
	require.Equal(t, int64(18), u.Active+u.Reserved)
}

// TestUnreachableSpareDoesNotBlockAnother: a store over one cluster with
// two Spares, the first unreachable (nothing listens), follows a growth
// onto the second, with its capacity policy: a cluster listed for a later
// growth that is down, or not provisioned yet, does not stop the store
// from following this one. (Every reload failed on probing the first
// spare, so the store never followed.)
func TestUnreachableSpareDoesNotBlockAnother(t *testing.T) {
	ctx := t.Context()
	cs := clusters(t)
	dead := etcdstore.Config{Endpoints: []string{"127.0.0.1:1"}, Namespace: "/dead/", DialTimeout: 200 * time.Millisecond, RequestTimeout: 500 * time.Millisecond}
	s, err := sharded.New(ctx, sharded.Config{Shards: cs[:1], Spares: []etcdstore.Config{dead, cs[1]}, CapacityPolicy: nodeBLimit(4)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	fx := conformance.NewFixture(t, harness(s, nil))
	run := &escrowRun{held: map[authority.Key]heldReservation{}}
	require.Equal(t, 2, reserveIn(t, s, fx, run, 0, 2, "before"))
	growWithLive(t, cs, nil)
	require.Eventually(t, func() bool { return s.Shards() == 2 }, time.Minute, 10*time.Millisecond, "the store follows the growth")
	in := fillShard(t, s, fx, run, 1, "new") + fillShard(t, s, fx, run, 0, "old")
	require.Equal(t, 2, in, "the policy of 4 holds over both shards")
	u := fx.ActorUsage(conformance.NodeB)
	require.Equal(t, int64(4), u.Active+u.Reserved)
}

// TestSpareOfAnAbortedMoveAddedLaterAtAnotherIndex: a store over one
// cluster with Spares B and C follows a move onto C that is aborted (it
// opened C as the move's shard 1), then the growth onto B (shard 1), then
// the one onto C, now shard 2: it routes and runs capacity escrow in C as
// shard 2 (a policy of 6 on NodeB holds over the three shards, with
// reservations in C). The store opened for the aborted move served shard
// 1's escrow hook.
func TestSpareOfAnAbortedMoveAddedLaterAtAnotherIndex(t *testing.T) {
	ctx := t.Context()
	cs := clusters(t)
	s, err := sharded.New(ctx, sharded.Config{Shards: cs[:1], Spares: cs[1:3], CapacityPolicy: nodeBLimit(6)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	fx := conformance.NewFixture(t, harness(s, nil))
	run := &escrowRun{held: map[authority.Key]heldReservation{}}
	require.Equal(t, 1, reserveIn(t, s, fx, run, 0, 1, "before"))

	onC := reshard.Config{Shards: cs[:1], Add: cs[2], LeaseWait: 5 * time.Second, AggregateWait: time.Second}
	jctx, cancel := context.WithCancel(ctx)
	stopped := onC
	stopped.Step = func(step string) {
		if step == "catching up" {
			cancel()
		}
	}
	_, err = reshard.Run(jctx, stopped)
	require.ErrorIs(t, err, context.Canceled)
	p, err := reshard.Abort(ctx, onC)
	require.NoError(t, err)
	require.Equal(t, schema.PhaseAborted, p.Phase)

	growWithLive(t, cs, nil) // B, shard 1
	require.Eventually(t, func() bool { return s.Shards() == 2 }, time.Minute, 10*time.Millisecond)
	grow(t, cs, 2, func(c *reshard.Config) { // C, shard 2
		c.LeaseWait = 100 * time.Millisecond
		c.Step = func(step string) {
			if step == "catching up" {
				markLiveIn(t, cs[2])
			}
		}
	})
	require.Eventually(t, func() bool { return s.Shards() == 3 }, time.Minute, 10*time.Millisecond)
	in2 := fillShard(t, s, fx, run, 2, "c")
	require.NotZero(t, in2, "admitted in shard 2")
	in := in2 + fillShard(t, s, fx, run, 1, "b") + fillShard(t, s, fx, run, 0, "a")
	u := fx.ActorUsage(conformance.NodeB)
	require.Equal(t, int64(6), u.Active+u.Reserved, "the policy holds over the three shards (%d admitted after)", in)
}

// firstGrowthStores opens over cs[0], both with policy, a store with cs[1]
// as its spare (so it runs escrow) and one without (which places without
// escrow; the caller closes it), and a writer on NodeB through the first
// with one reservation made (seeded with seed).
func firstGrowthStores(t *testing.T, cs []etcdstore.Config, policy authority.CapacityPolicy, seed uint64) (s, plain *sharded.Store, fx *conformance.Fixture, run *escrowRun, w *escrowWriter) {
	t.Helper()
	ctx := t.Context()
	s, err := sharded.New(ctx, sharded.Config{Shards: cs[:1], Spares: cs[1:2], CapacityPolicy: policy})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	plain, err = sharded.New(ctx, sharded.Config{Shards: cs[:1], CapacityPolicy: policy})
	require.NoError(t, err)
	fx = conformance.NewFixture(t, harness(s, nil))
	run = &escrowRun{held: map[authority.Key]heldReservation{}}
	w = &escrowWriter{s: s, fx: fx, rng: rand.New(rand.NewPCG(seed, seed)), run: run}
	require.False(t, w.reserve(ctx))
	return s, plain, fx, run, w
}
