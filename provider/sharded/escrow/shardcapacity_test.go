package escrow_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/internal/testkit/capacitytest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
)

// limits is a capacity policy with a limit on the actors and one on the
// Spots (of every type) of a node: monotone on the totals, as escrow
// assumes.
type limits struct{ actors, spots int64 }

func (l limits) PlacementCapacityAvailable(_ authority.NodeDescriptor, requested, reserved, active authority.CapacityVector) bool {
	return requested.Actors+reserved.Actors+active.Actors <= l.actors && requested.Spots+reserved.Spots+active.Spots <= l.spots
}

// held is one row a writer holds: reserved, or active after a commit.
type held struct {
	req    authority.ReserveRequest
	res    authority.ReserveResult
	active *authority.Snapshot
}

// capacityRun counts what the writers of one run saw.
type capacityRun struct {
	// holding is, per kind, a lower bound of the capacity held over all
	// shards: +1 once a reservation is acknowledged, -1 before a release
	// is sent. peak is its highest value.
	holding, peak                 [2]atomic.Int64
	admitted, exhausted, retried  atomic.Int64
	releases, commits, unexpected atomic.Int64
	unknown                       atomic.Int64 // reservations of unknown outcome
	firstUnexpected               atomic.Value
}

func kindIndex(kind authority.ObjectKind) int {
	if kind == authority.ObjectActor {
		return 0
	}
	return 1
}

// took records an acknowledged reservation of kind.
func (r *capacityRun) took(kind authority.ObjectKind) {
	i := kindIndex(kind)
	capacitytest.Took(&r.holding[i], &r.peak[i])
	r.admitted.Add(1)
}

func (r *capacityRun) fail(err error) {
	r.unexpected.Add(1)
	r.firstUnexpected.CompareAndSwap(nil, err.Error())
}

// capacityWriter is one writer: its store, its kind and the rows it holds.
type capacityWriter struct {
	id    int
	store *etcdstore.Store
	kind  authority.ObjectKind
	rows  []held
	seq   int
	rng   *rand.Rand
	run   *capacityRun
}

// reserve reserves a new row: true when the node was exhausted.
func (w *capacityWriter) reserve(ctx context.Context) (exhausted bool) {
	w.seq++
	req := reserveRequest(w.kind, fmt.Sprintf("w%d-%d", w.id, w.seq))
	res, err := w.store.Reserve(ctx, req)
	switch {
	case errors.Is(err, authority.ErrUnavailable):
		w.run.retried.Add(1) // nothing written: contention
	case err != nil:
		w.run.fail(err)
	case res.Kind == authority.KindReserved:
		w.run.took(w.kind)
		w.rows = append(w.rows, held{req: req, res: res})
	case res.Kind == authority.KindPlacementCapacityExhausted:
		w.run.exhausted.Add(1)
		return true
	default:
		w.run.fail(fmt.Errorf("reserve: %s", res.Kind))
	}
	return false
}

// reserveAllowingUnknown is reserve on a context that may end mid-way: an
// unknown outcome is counted, not a failure (the row may hold capacity,
// which the caller then reads back).
func (w *capacityWriter) reserveAllowingUnknown(ctx context.Context) {
	w.seq++
	req := reserveRequest(w.kind, fmt.Sprintf("w%d-%d", w.id, w.seq))
	res, err := w.store.Reserve(ctx, req)
	switch {
	case errors.Is(err, authority.ErrOutcomeUnknown) || (err != nil && ctx.Err() != nil):
		w.run.unknown.Add(1)
	case errors.Is(err, authority.ErrUnavailable):
		w.run.retried.Add(1)
	case err != nil:
		w.run.fail(err)
	case res.Kind == authority.KindReserved:
		w.run.took(w.kind)
		w.rows = append(w.rows, held{req: req, res: res})
	case res.Kind == authority.KindPlacementCapacityExhausted:
		w.run.exhausted.Add(1)
	default:
		w.run.fail(fmt.Errorf("reserve: %s", res.Kind))
	}
}

// commitOne turns one reserved Spot active.
func (w *capacityWriter) commitOne(ctx context.Context) {
	for i := range w.rows {
		h := &w.rows[i]
		if h.active != nil || !w.kind.IsSpot() {
			continue
		}
		res, err := w.store.Commit(ctx, authority.CommitRequest{Key: h.req.Key, ReservationID: h.res.ReservationID,
			ExpectedStoreVersion: h.res.Creating.StoreVersion, Target: target, ReadyPayload: []byte("ready")})
		if err != nil || res.Kind != authority.KindCommitted {
			w.run.fail(fmt.Errorf("commit: %v %v", res.Kind, err))
			return
		}
		h.active = res.Ready
		w.run.commits.Add(1)
		return
	}
}

// releaseOne aborts a reserved row or deletes an active one; the capacity
// stops counting as held before the release is sent.
func (w *capacityWriter) releaseOne(ctx context.Context) {
	if len(w.rows) == 0 {
		return
	}
	i := w.rng.IntN(len(w.rows))
	h := w.rows[i]
	w.rows = append(w.rows[:i], w.rows[i+1:]...)
	w.run.holding[kindIndex(w.kind)].Add(-1)
	w.run.releases.Add(1)
	if h.active != nil {
		key, _ := h.req.Key.Encode()
		res, err := w.store.CompareExchangeAuthority(ctx, key, h.active.StoreVersion, authority.Delete())
		if err != nil || res.Kind != authority.KindDeleted {
			w.run.fail(fmt.Errorf("delete: %v %v", res.Kind, err))
		}
		return
	}
	res, err := w.store.Abort(ctx, authority.AbortRequest{Key: h.req.Key, ReservationID: h.res.ReservationID,
		ExpectedStoreVersion: h.res.Creating.StoreVersion, Target: target})
	if err != nil || res.Kind != authority.KindAborted {
		w.run.fail(fmt.Errorf("abort: %v %v", res.Kind, err))
	}
}

// fill reserves until the node is exhausted once.
func (w *capacityWriter) fill(ctx context.Context) {
	for !w.reserve(ctx) && w.run.unexpected.Load() == 0 {
	}
}

// churn reserves, commits and releases at random for ops steps.
func (w *capacityWriter) churn(ctx context.Context, ops int) {
	for range ops {
		switch r := w.rng.IntN(10); {
		case r < 4:
			w.reserve(ctx)
		case r < 6:
			w.commitOne(ctx)
		default:
			w.releaseOne(ctx)
		}
	}
}

// everyWriter runs f on every writer at once.
func everyWriter(writers []*capacityWriter, f func(w *capacityWriter)) { capacitytest.Each(writers, f) }

// TestShardCapacity: 36 writers, 12 on each of the three shards, through
// two sets of stores (two processes, each with its own mover), reserve
// actors and Spots of one node against its limits. Fill: every writer
// reserves until it is refused, and exactly the limits are admitted.
// Churn: writers reserve, commit, abort and delete at random while a mover
// reclaims every shard's slack in a loop (releases racing reservations);
// the capacity held over all shards never passes the limits. Refill: the
// writers of one shard reserve until refused again, and the node is
// exactly full (the other shards' slack was reclaimed). After a reconcile
// nothing is in flight, and after a reclaim the ledger grants exactly the
// usage.
func TestShardCapacity(t *testing.T) {
	const writers, actorLimit, spotLimit, churnOps = 36, 40, 60, 40
	policy := limits{actors: actorLimit, spots: spotLimit}
	a := openShards(t, "", setOptions{policy: policy})
	b := openShards(t, a.ns, setOptions{policy: policy})
	run := &capacityRun{}
	var ws []*capacityWriter
	for i := range writers {
		set := []*shardSet{a, b}[i%2]
		kind := []authority.ObjectKind{authority.ObjectActor, authority.ObjectUserSpot}[i/2%2]
		ws = append(ws, &capacityWriter{id: i, store: set.stores[i%shardCount], kind: kind, rng: rand.New(rand.NewPCG(uint64(i), 42)), run: run})
	}
	ctx := t.Context()
	requireFull := func(phase string) {
		t.Helper()
		require.Zero(t, run.unexpected.Load(), "%s: %v", phase, run.firstUnexpected.Load())
		aa, ar := a.usage(t, authority.ObjectActor)
		sa, sr := a.usage(t, authority.CounterSpots)
		require.Equal(t, int64(actorLimit), aa+ar, "%s: actors held over all shards", phase)
		require.Equal(t, int64(spotLimit), sa+sr, "%s: Spots held over all shards", phase)
		require.Equal(t, int64(actorLimit), run.holding[0].Load(), phase)
		require.Equal(t, int64(spotLimit), run.holding[1].Load(), phase)
	}

	everyWriter(ws, func(w *capacityWriter) { w.fill(ctx) })
	requireFull("fill")
	require.Equal(t, int64(actorLimit+spotLimit), run.admitted.Load(), "fill admits exactly the limits")

	stop := make(chan struct{})
	var reclaims atomic.Int64
	var reclaimer sync.WaitGroup
	reclaimer.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := b.mover.ReconcileAll(ctx, true); err != nil && !errors.Is(err, authority.ErrUnavailable) {
				run.fail(err)
				return
			}
			reclaims.Add(1)
		}
	})
	everyWriter(ws, func(w *capacityWriter) { w.churn(ctx, churnOps) })
	close(stop)
	reclaimer.Wait()
	require.Zero(t, run.unexpected.Load(), "churn: %v", run.firstUnexpected.Load())

	// refill from shard 0 alone: the slack the churn left in the other
	// shards must come back through reclaims
	var first []*capacityWriter
	for _, w := range ws {
		if w.id%shardCount == 0 {
			first = append(first, w)
		}
	}
	everyWriter(first, func(w *capacityWriter) { w.fill(ctx) })
	requireFull("refill")

	_, err := a.mover.ReconcileAll(ctx, false)
	require.NoError(t, err)
	a.requireSettled(t, false)
	_, err = a.mover.ReconcileAll(ctx, true)
	require.NoError(t, err)
	a.requireSettled(t, true)

	peak := run.peak[0].Load() + run.peak[1].Load()
	over := max(0, run.peak[0].Load()-actorLimit) + max(0, run.peak[1].Load()-spotLimit)
	sa, sb := a.mover.Stats(), b.mover.Stats()
	t.Logf("shard-capacity: shards=%d writers=%d limit=%d peak=%d over-admitted=%d admitted=%d exhausted=%d unavailable=%d releases=%d commits=%d grows=%d grants=%d reclaims=%d reclaim-loops=%d",
		shardCount, writers, actorLimit+spotLimit, peak, over, run.admitted.Load(), run.exhausted.Load(), run.retried.Load(),
		run.releases.Load(), run.commits.Load(), sa.Grows+sb.Grows, sa.Grants+sb.Grants, sa.Reclaims+sb.Reclaims, reclaims.Load())
	require.Zero(t, over, "over-admitted")
	require.Equal(t, int64(actorLimit), run.peak[0].Load(), "the actor peak is the limit")
	require.Equal(t, int64(spotLimit), run.peak[1].Load(), "the Spot peak is the limit")
}
