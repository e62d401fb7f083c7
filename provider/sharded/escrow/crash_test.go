package escrow_test

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/sharded/escrow"
)

// The faults a faultyShard injects, each where a mover can stop between
// the two steps of a transfer.
const (
	faultReceive   = iota // the grant is in the ledger, the mover stops before the slice receives it
	faultCredit           // the slice released its slack, the mover stops before the ledger takes it back
	faultGrantLost        // the grant applied but its answer was lost (ErrOutcomeUnknown)
	faultCutShort         // a release or receive sent with a deadline of 0-3 ms (it may or may not apply)
	faultKinds
)

var faultNames = [faultKinds]string{"receive-dropped", "credit-dropped", "grant-answer-lost", "cut-short"}

// faults decides, shared by every faultyShard of a test, when to fail.
type faults struct {
	on       atomic.Bool
	mu       sync.Mutex
	rng      *rand.Rand
	injected [faultKinds]atomic.Int64
}

// hit reports whether the step should fail with fault kind (one in three
// while on), and counts it.
func (f *faults) hit(kind int) bool {
	if !f.on.Load() {
		return false
	}
	f.mu.Lock()
	hit := f.rng.IntN(3) == 0
	f.mu.Unlock()
	if hit {
		f.injected[kind].Add(1)
	}
	return hit
}

func (f *faults) each() bool {
	for i := range f.injected {
		if f.injected[i].Load() == 0 {
			return false
		}
	}
	return true
}

// faultyShard is a shard's steps as a crashing, timing-out mover sees
// them: another implementation of escrow.Shard, failing at every step the
// protocol allows to fail.
type faultyShard struct {
	escrow.Shard
	f *faults
}

var errInjected = authority.Wrap(authority.ErrUnavailable, "injected: the mover stopped here", nil)

func (s faultyShard) Receive(ctx context.Context, node authority.NodeDescriptor, lifecycle int64, given schema.Budget) (schema.BudgetSlice, error) {
	if s.f.hit(faultReceive) {
		return schema.BudgetSlice{}, errInjected
	}
	if s.f.hit(faultCutShort) {
		cut, cancel := context.WithTimeout(ctx, time.Duration(rand.IntN(3000))*time.Microsecond)
		defer cancel()
		_, _ = s.Shard.Receive(cut, node, lifecycle, given)
		return schema.BudgetSlice{}, errInjected
	}
	return s.Shard.Receive(ctx, node, lifecycle, given)
}

func (s faultyShard) Release(ctx context.Context, node authority.NodeDescriptor, lifecycle int64) (schema.BudgetSlice, error) {
	if s.f.hit(faultCutShort) {
		cut, cancel := context.WithTimeout(ctx, time.Duration(rand.IntN(3000))*time.Microsecond)
		defer cancel()
		_, _ = s.Shard.Release(cut, node, lifecycle)
		return schema.BudgetSlice{}, errInjected
	}
	return s.Shard.Release(ctx, node, lifecycle)
}

func (s faultyShard) Credit(ctx context.Context, node authority.NodeDescriptor, lifecycle int64, shard int, returned schema.Budget) (schema.BudgetLedger, error) {
	if s.f.hit(faultCredit) {
		return schema.BudgetLedger{}, errInjected
	}
	return s.Shard.Credit(ctx, node, lifecycle, shard, returned)
}

func (s faultyShard) Grant(ctx context.Context, node authority.NodeDescriptor, lifecycle int64, shard int, asks ...authority.CapacityVector) (schema.BudgetLedger, error) {
	led, err := s.Shard.Grant(ctx, node, lifecycle, shard, asks...)
	if err == nil && s.f.hit(faultGrantLost) {
		return schema.BudgetLedger{}, authority.Wrap(authority.ErrOutcomeUnknown, "injected: the grant's answer was lost", nil)
	}
	return led, err
}

// TestShardCapacityCrashBetweenSteps: writers on the three shards reserve
// and release against one node's limits while the movers stop between the
// two steps of transfers (a grant not received, a release not credited, a
// grant whose answer was lost, steps cut short by their deadline) and the
// writers' own contexts end at random mid-protocol. The limits hold
// throughout. Budget left in flight is only under-used: a reconcile by a
// mover without faults finishes every transfer, a reclaim leaves the
// ledger granting exactly the usage, and the writers then fill the node to
// exactly its limits.
func TestShardCapacityCrashBetweenSteps(t *testing.T) {
	const writers, actorLimit, spotLimit = 12, 20, 25
	policy := limits{actors: actorLimit, spots: spotLimit}
	f := &faults{rng: rand.New(rand.NewPCG(1, 2))}
	f.on.Store(true)
	faulty := openShards(t, "", setOptions{policy: policy, wrap: func(_ int, sh escrow.Shard) escrow.Shard { return faultyShard{sh, f} }})
	clean := openShards(t, faulty.ns, setOptions{policy: policy})
	run := &capacityRun{}
	var ws []*capacityWriter
	for i := range writers {
		kind := []authority.ObjectKind{authority.ObjectActor, authority.ObjectUserSpot}[i%2]
		ws = append(ws, &capacityWriter{id: i, store: faulty.stores[i%shardCount], kind: kind, rng: rand.New(rand.NewPCG(uint64(i), 7)), run: run})
	}
	ctx := t.Context()
	// churn until every fault happened (and at least 4 rounds), each
	// writer's operations on contexts that end at random, 0-20 ms in
	for round := 0; round < 4 || !f.each(); round++ {
		require.Less(t, round, 200, "faults injected so far: %v", injectedCounts(f))
		everyWriter(ws, func(w *capacityWriter) {
			for range 10 {
				short, cancel := context.WithTimeout(ctx, time.Duration(w.rng.IntN(20_000))*time.Microsecond)
				if w.rng.IntN(3) == 0 {
					w.releaseOne(ctx)
				} else {
					w.reserveAllowingUnknown(short)
				}
				cancel()
			}
			w.fill(ctx) // until refused (or failed) once
		})
		require.Zero(t, run.unexpected.Load(), "round %d: %v", round, run.firstUnexpected.Load())
		requireWithin(t, clean, actorLimit, spotLimit)
	}
	f.on.Store(false)
	_, err := clean.mover.ReconcileAll(ctx, false)
	require.NoError(t, err)
	clean.requireSettled(t, false)
	_, err = clean.mover.ReconcileAll(ctx, true)
	require.NoError(t, err)
	clean.requireSettled(t, true)

	// reservations whose outcome was unknown hold capacity too: count what
	// is held now, then fill to the limits
	for _, w := range ws {
		w.fill(ctx)
	}
	require.Zero(t, run.unexpected.Load(), "%v", run.firstUnexpected.Load())
	aa, ar := clean.usage(t, authority.ObjectActor)
	sa, sr := clean.usage(t, authority.CounterSpots)
	require.Equal(t, int64(actorLimit), aa+ar, "actors held after the faults stopped")
	require.Equal(t, int64(spotLimit), sa+sr, "Spots held after the faults stopped")
	require.LessOrEqual(t, run.peak[0].Load(), int64(actorLimit))
	require.LessOrEqual(t, run.peak[1].Load(), int64(spotLimit))
	t.Logf("shard-capacity-crash: shards=%d writers=%d faults=%v unknown-reservations=%d peak-actors=%d/%d peak-spots=%d/%d over-admitted=0",
		shardCount, writers, injectedCounts(f), run.unknown.Load(), run.peak[0].Load(), actorLimit, run.peak[1].Load(), spotLimit)
}

func injectedCounts(f *faults) map[string]int64 {
	m := map[string]int64{}
	for i, name := range faultNames {
		m[name] = f.injected[i].Load()
	}
	return m
}

// requireWithin checks the capacity held over all shards (read shard by
// shard while nothing runs) is within the limits, and the ledger grants
// at least that.
func requireWithin(t *testing.T, set *shardSet, actorLimit, spotLimit int64) {
	t.Helper()
	aa, ar := set.usage(t, authority.ObjectActor)
	sa, sr := set.usage(t, authority.CounterSpots)
	require.LessOrEqual(t, aa+ar, actorLimit, "actors held over all shards")
	require.LessOrEqual(t, sa+sr, spotLimit, "Spots held over all shards")
	led, err := set.stores[escrow.HomeShard(node, shardCount)].Budget().Ledger(context.Background(), node, lifecycle)
	require.NoError(t, err)
	g := led.Granted()
	require.LessOrEqual(t, aa+ar, g[schema.BudgetCounter{Kind: authority.ObjectActor}], "the ledger grants at least the actors held")
	require.LessOrEqual(t, g[schema.BudgetCounter{Kind: authority.ObjectActor}], actorLimit)
	require.LessOrEqual(t, g[schema.BudgetCounter{Kind: authority.CounterSpots}], spotLimit)
}
