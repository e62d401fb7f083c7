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
	"github.com/zlink-systems/authority/provider/sharded"
	"github.com/zlink-systems/authority/provider/sharded/reshard"
)

// plainWriter reserves actors on NodeB (ids prefix-0, prefix-1, ...)
// through a store over one shard without Spares, so without capacity
// escrow, until placed reaches upTo, or (with a nil stop) the policy
// refuses one, or stop closes. Once the job froze the shard, its writes
// fail their map fence and it cannot follow the move (ErrUnavailable).
func plainWriter(ctx context.Context, s *sharded.Store, fx *conformance.Fixture, run *escrowRun, prefix string, placed *atomic.Int64, upTo int64, stop <-chan struct{}) {
	for seq := 0; placed.Load() < upTo; seq++ {
		select {
		case <-stop:
			return
		default:
		}
		req := actorReservation(fmt.Sprintf("%s-%d", prefix, seq))
		key := fx.Key(authority.ObjectActor, req.Key.GlobalID)
		res, err := s.Reserve(ctx, req)
		switch {
		case errors.Is(err, authority.ErrUnavailable):
			run.retried.Add(1)
			time.Sleep(5 * time.Millisecond)
		case err != nil:
			run.fail(fmt.Errorf("plain reserve %s: %w", key, err))
			return
		case res.Kind == authority.KindReserved:
			run.took(key, req.Key, res)
			placed.Add(1)
		case res.Kind == authority.KindPlacementCapacityExhausted:
			run.exhausted.Add(1)
			if stop == nil {
				return
			}
			time.Sleep(5 * time.Millisecond)
		default:
			run.fail(fmt.Errorf("plain reserve %s: %s", key, res.Kind))
			return
		}
	}
}

// heldIn counts the held reservations whose key is in shard i of s's map.
func heldIn(run *escrowRun, s *sharded.Store, i int) int {
	if s.Shards() <= i {
		return 0
	}
	run.mu.Lock()
	defer run.mu.Unlock()
	n := 0
	for key := range run.held {
		if s.ShardOf(key) == i {
			n++
		}
	}
	return n
}

// TestEscrowFollowsFirstGrowth: two sharded stores over ONE cluster with
// Spares and a limit of 20 actors on NodeB run capacity escrow from New
// on; a third store over that cluster without Spares (no escrow) places
// actors on NodeB before the job and while it runs (until the freeze
// stops it), so the first shard holds usage no budget slice covers. 8
// writers reserve and abort actors on NodeB through the escrow stores
// while the job grows the map 1 → 2. The writers keep writing through
// the growth (never ErrCapacityNeedsEscrow; only ErrUnavailable retries),
// the actors NodeB holds never pass the limit, every acknowledged
// reservation reads back and NodeB's usage equals them, and afterwards,
// with room on the node, a reservation in the new shard is admitted, up to
// exactly the limit.
func TestEscrowFollowsFirstGrowth(t *testing.T) {
	const writers = 8
	ctx := t.Context()
	cs := clusters(t)
	policy := nodeBLimit(escrowLimit)
	var stores []*sharded.Store
	for range 2 {
		s, err := sharded.New(ctx, sharded.Config{Shards: cs[:1], Spares: cs[1:2], CapacityPolicy: policy})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		stores = append(stores, s)
	}
	plain, err := sharded.New(ctx, sharded.Config{Shards: cs[:1], CapacityPolicy: policy})
	require.NoError(t, err)
	t.Cleanup(func() { _ = plain.Close() })
	fx := conformance.NewFixture(t, harness(stores[0], nil))
	run := &escrowRun{held: map[authority.Key]heldReservation{}}
	var ws []*escrowWriter
	for i := range writers {
		ws = append(ws, &escrowWriter{id: i, s: stores[i%2], fx: fx, rng: rand.New(rand.NewPCG(uint64(i), 44)), run: run})
	}
	// before the job: the store without escrow places first, then an
	// escrow store (its grow covers that usage), then the plain store again
	// (usage beyond the slice), then the escrow store fills NodeB
	var plainN atomic.Int64
	plainWriter(ctx, plain, fx, run, "plain-a", &plainN, 3, nil)
	for range 5 {
		ws[0].reserve(ctx)
	}
	plainWriter(ctx, plain, fx, run, "plain-b", &plainN, 5, nil)
	require.Equal(t, int64(5), plainN.Load())
	for full := false; !full; {
		full = ws[0].reserve(ctx)
	}
	require.Nil(t, run.unexpected.Load())
	require.Equal(t, int64(escrowLimit), run.holding.Load(), "filled to the limit over one shard, with and without escrow")

	stop := make(chan struct{})
	var wg sync.WaitGroup
	churn(&wg, ws, stop, reserveOrAbort(ctx))
	wg.Go(func() { plainWriter(ctx, plain, fx, run, "plain-c", &plainN, 8, stop) })
	p := growWhileWriting(t, ctx, cs, 1, run)
	// the writers go on until both stores route by the grown map and
	// reservations were admitted in the new cluster (bounded)
	deadline := time.Now().Add(2 * time.Minute)
	for (stores[0].Shards() < 2 || stores[1].Shards() < 2 || heldIn(run, stores[0], 1) == 0) && time.Now().Before(deadline) && run.unexpected.Load() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	require.Nil(t, run.unexpected.Load())
	require.Equal(t, 2, stores[0].Shards())
	require.Equal(t, 2, stores[1].Shards())
	require.NotZero(t, run.duringJob.Load(), "writers were admitted while the job ran")
	require.NotZero(t, p.Rows, "rows moved")
	require.NotZero(t, heldIn(run, stores[0], 1), "reservations held in the new shard")

	// every acknowledged reservation reads back; NodeB's usage is theirs
	held, over := requireHeldReadBack(t, run, stores[1], fx, "NodeB's actors over the two shards, each row once")
	u := fx.ActorUsage(conformance.NodeB)

	// room on the node: a reservation in the new shard is admitted, and
	// filling the node there stops exactly at the limit
	releaser := &escrowWriter{s: stores[0], fx: fx, rng: rand.New(rand.NewPCG(7, 7)), run: run}
	run.mu.Lock()
	for key := range run.held {
		if stores[0].ShardOf(key) == 0 {
			releaser.mine = append(releaser.mine, key)
		}
	}
	run.mu.Unlock()
	for range min(3, len(releaser.mine)) {
		releaser.abort(ctx)
	}
	require.Nil(t, run.unexpected.Load())
	inNew := fillShard(t, stores[1], fx, run, 1, "new")
	require.NotZero(t, inNew, "a reservation in the new shard is admitted below the limit")
	u = fx.ActorUsage(conformance.NodeB)
	require.Equal(t, int64(escrowLimit), u.Active+u.Reserved, "the new shard fills NodeB to its limit, not past it")
	require.LessOrEqual(t, run.peak.Load(), int64(escrowLimit), "over-admitted")
	e0, e1 := stores[0].EscrowStats(), stores[1].EscrowStats()
	t.Logf("escrow-first-growth: from=1 to=2 limit=%d peak=%d over-admitted=%d moved=%d admitted=%d admitted-during-job=%d plain-placed=%d exhausted=%d unavailable=%d held-after=%d held-in-new-shard=%d reserved-in-new-shard=%d grows=%d grants=%d reclaims=%d",
		escrowLimit, run.peak.Load(), over, p.Rows, run.admitted.Load(), run.duringJob.Load(), plainN.Load(), run.exhausted.Load(), run.retried.Load(), held, heldIn(run, stores[0], 1), inNew,
		e0.Grows+e1.Grows, e0.Grants+e1.Grants, e0.Reclaims+e1.Reclaims)
}

// fillShard reserves actors on NodeB whose keys are in shard i through s
// until the node is full, and returns how many were admitted.
func fillShard(t *testing.T, s *sharded.Store, fx *conformance.Fixture, run *escrowRun, i int, prefix string) (admitted int) {
	t.Helper()
	for seq := 0; ; seq++ {
		req := actorReservation(fmt.Sprintf("%s-%d", prefix, seq))
		key := fx.Key(authority.ObjectActor, req.Key.GlobalID)
		if s.ShardOf(key) != i {
			continue
		}
		res, err := s.Reserve(t.Context(), req)
		require.NoError(t, err)
		if res.Kind == authority.KindPlacementCapacityExhausted {
			return admitted
		}
		require.Equal(t, authority.KindReserved, res.Kind)
		run.took(key, req.Key, res)
		admitted++
	}
}

// TestFirstGrowthCountsCapacityPlacedWithoutEscrow: over one cluster with a
// limit of 20 actors on NodeB, a store with Spares (escrow) reserves one
// actor (its slice takes a chunk of 8), then a store without Spares (no
// escrow) fills NodeB to the limit on the cluster's usage: 12 actors lie
// beyond the slice. After the growth 1 → 2 no reservation in either shard
// is admitted (the switch covered that usage in the node's budget; without
// it a grow in the new shard counts 8 and admits 12 more), and once one
// actor is released, one in the new shard takes its place.
func TestFirstGrowthCountsCapacityPlacedWithoutEscrow(t *testing.T) {
	ctx := t.Context()
	cs := clusters(t)
	policy := nodeBLimit(escrowLimit)
	s, err := sharded.New(ctx, sharded.Config{Shards: cs[:1], Spares: cs[1:2], CapacityPolicy: policy})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	plain, err := sharded.New(ctx, sharded.Config{Shards: cs[:1], CapacityPolicy: policy})
	require.NoError(t, err)
	fx := conformance.NewFixture(t, harness(s, nil))
	run := &escrowRun{held: map[authority.Key]heldReservation{}}
	res, err := s.Reserve(ctx, actorReservation("escrow-0"))
	require.NoError(t, err)
	require.Equal(t, authority.KindReserved, res.Kind)
	run.took(fx.Key(authority.ObjectActor, "escrow-0"), actorReservation("escrow-0").Key, res)
	var placed atomic.Int64
	plainWriter(ctx, plain, fx, run, "plain", &placed, escrowLimit, nil) // until the policy refuses
	require.Equal(t, int64(escrowLimit-1), placed.Load())
	require.Nil(t, run.unexpected.Load())
	require.Equal(t, int64(escrowLimit), run.holding.Load())
	require.NoError(t, plain.Close())

	grow(t, cs, 1, func(c *reshard.Config) {
		c.LeaseWait = 100 * time.Millisecond
		c.Step = func(step string) {
			if step == "catching up" {
				markLiveIn(t, cs[1])
			}
		}
	})
	require.Eventually(t, func() bool { return s.Shards() == 2 }, time.Minute, 10*time.Millisecond)
	require.Zero(t, fillShard(t, s, fx, run, 1, "new"), "NodeB is full: nothing admitted in the new shard")
	require.Zero(t, fillShard(t, s, fx, run, 0, "old"), "nor in the first")
	u := fx.ActorUsage(conformance.NodeB)
	require.Equal(t, int64(escrowLimit), u.Active+u.Reserved)

	releaser := &escrowWriter{s: s, fx: fx, rng: rand.New(rand.NewPCG(3, 3)), run: run}
	for key := range run.held {
		releaser.mine = append(releaser.mine, key)
	}
	releaser.abort(ctx)
	require.Nil(t, run.unexpected.Load())
	require.Equal(t, 1, fillShard(t, s, fx, run, 1, "new-after"), "a released actor's place is taken in the new shard")
	u = fx.ActorUsage(conformance.NodeB)
	require.Equal(t, int64(escrowLimit), u.Active+u.Reserved)
}
