package sharded_test

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
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/capacitytest"
	"github.com/zlink-systems/authority/provider/sharded"
)

// capacityRun counts what the writers of TestShardCapacityThroughTheStore
// saw. holding is a lower bound of the actors NodeB holds over every shard:
// +1 once a reservation or an aggregate prepare is acknowledged, -1 before
// its release is sent; peak is its highest value.
type capacityRun struct {
	holding, peak                 atomic.Int64
	admitted, moved, exhausted    atomic.Int64
	retried, releases, unexpected atomic.Int64
	firstUnexpected               atomic.Value
}

func (r *capacityRun) took() {
	capacitytest.Took(&r.holding, &r.peak)
	r.admitted.Add(1)
}

func (r *capacityRun) fail(err error) {
	r.unexpected.Add(1)
	r.firstUnexpected.CompareAndSwap(nil, err.Error())
}

// mover is a row an aggregate writer moves from NodeA onto NodeB with an
// aggregate across shards.
type mover struct {
	key   authority.Key
	onB   bool
	moved int // the aggregates that tried to move it
}

// capacityWriter reserves actors on NodeB, or (with movers) moves its
// rows onto NodeB with aggregates whose other participant, anchor, lives
// in another shard.
type capacityWriter struct {
	id     int
	s      *sharded.Store
	rng    *rand.Rand
	run    *capacityRun
	seq    int
	held   []authority.ReserveResult
	keys   []authority.ObjectKey
	movers []*mover
	anchor authority.Key
}

// reserveRequest is a valid reservation of an actor id on target.
func reserveRequest(id string, target authority.CreationTarget) authority.ReserveRequest {
	return capacitytest.ActorReservation(id, target)
}

// place reserves an actor on NodeB, or moves a row there: true when the
// node was full.
func (w *capacityWriter) place(ctx context.Context) (full bool) {
	for _, m := range w.movers {
		if !m.onB {
			return w.move(ctx, m)
		}
	}
	w.seq++
	req := reserveRequest(fmt.Sprintf("w%d-%d", w.id, w.seq), conformance.TargetB)
	res, err := w.s.Reserve(ctx, req)
	switch {
	case errors.Is(err, authority.ErrUnavailable):
		w.run.retried.Add(1) // nothing written: contention
	case err != nil:
		w.run.fail(err)
	case res.Kind == authority.KindReserved:
		w.run.took()
		w.held, w.keys = append(w.held, res), append(w.keys, req.Key)
	case res.Kind == authority.KindPlacementCapacityExhausted:
		w.run.exhausted.Add(1)
		return true
	default:
		w.run.fail(fmt.Errorf("reserve: %s", res.Kind))
	}
	return false
}

// move moves m onto NodeB with an aggregate across shards (m and the
// anchor), committed at once.
func (w *capacityWriter) move(ctx context.Context, m *mover) (full bool) {
	rows := map[authority.Key]authority.StoreVersion{}
	for _, k := range []authority.Key{m.key, w.anchor} {
		r, err := w.s.ReadAuthority(ctx, k)
		if err != nil || r.Kind != authority.KindSnapshot {
			w.run.fail(fmt.Errorf("read %s: %v %v", k, r.Kind, err))
			return true
		}
		rows[k] = r.Snapshot.StoreVersion
	}
	m.moved++
	req := conformance.AggregateRequest(fmt.Sprintf("w%d-%s-%d", w.id, m.key, m.moved), 1, conformance.TargetB, authority.CapacityVector{Actors: 1},
		conformance.Participant(m.key, rows[m.key], authority.TransitionNewOwner, []byte("moved")),
		conformance.Participant(w.anchor, rows[w.anchor], authority.TransitionPreserve, []byte(fmt.Sprintf("anchor-%d", m.moved))))
	res, err := w.s.PrepareAggregate(ctx, req)
	switch {
	case errors.Is(err, authority.ErrUnavailable):
		// contention; the record (and some parts) may be written: abort
		// it, as a caller of a prepare that failed does
		w.run.retried.Add(1)
		w.abandon(ctx, req.Fence())
		return false
	case err != nil:
		w.run.fail(err)
		return true
	case res.Kind == authority.KindConflict:
		w.run.exhausted.Add(1)
		return true
	case res.Kind != authority.KindPrepared:
		w.run.fail(fmt.Errorf("prepare: %s", res.Kind))
		return true
	}
	w.run.took()
	commit, err := w.s.CommitAggregate(ctx, req.Fence())
	if err != nil || commit.Kind != authority.KindCommitted {
		w.run.fail(fmt.Errorf("commit: %v %v", commit.Kind, err))
		return true
	}
	m.onB = true
	w.run.moved.Add(1)
	return false
}

// abandon aborts the aggregate of a prepare that failed, until the abort
// answers.
func (w *capacityWriter) abandon(ctx context.Context, fence authority.Fence) {
	for range 16 {
		res, err := w.s.AbortAggregate(ctx, fence)
		if err == nil {
			if res.Kind != authority.KindAborted && res.Kind != authority.KindAlreadyAborted && res.Kind != authority.KindStale {
				w.run.fail(fmt.Errorf("abort of a failed prepare: %s", res.Kind))
			}
			return
		}
		if !errors.Is(err, authority.ErrUnavailable) {
			w.run.fail(err)
			return
		}
	}
	w.run.fail(fmt.Errorf("abort of a failed prepare kept failing"))
}

// releaseOne aborts a reservation or deletes a moved row; it stops
// counting before the release is sent.
func (w *capacityWriter) releaseOne(ctx context.Context) {
	if len(w.held) > 0 {
		i := w.rng.IntN(len(w.held))
		res, key := w.held[i], w.keys[i]
		w.held, w.keys = append(w.held[:i], w.held[i+1:]...), append(w.keys[:i], w.keys[i+1:]...)
		w.run.holding.Add(-1)
		w.run.releases.Add(1)
		out, err := w.s.Abort(ctx, authority.AbortRequest{Key: key, ReservationID: res.ReservationID,
			ExpectedStoreVersion: res.Creating.StoreVersion, Target: conformance.TargetB})
		if err != nil || out.Kind != authority.KindAborted {
			w.run.fail(fmt.Errorf("abort: %v %v", out.Kind, err))
		}
		return
	}
	for _, m := range w.movers {
		if !m.onB {
			continue
		}
		r, err := w.s.ReadAuthority(ctx, m.key)
		if err != nil || r.Kind != authority.KindSnapshot {
			w.run.fail(fmt.Errorf("read %s: %v %v", m.key, r.Kind, err))
			return
		}
		w.run.holding.Add(-1)
		w.run.releases.Add(1)
		res, err := w.s.CompareExchangeAuthority(ctx, m.key, r.Snapshot.StoreVersion, authority.Delete())
		if err != nil || res.Kind != authority.KindDeleted {
			w.run.fail(fmt.Errorf("delete: %v %v", res.Kind, err))
		}
		m.onB = false // gone: place reserves from now on
		m.key = ""
		w.movers = removeMover(w.movers, m)
		return
	}
}

func removeMover(ms []*mover, m *mover) []*mover {
	for i, x := range ms {
		if x == m {
			return append(ms[:i], ms[i+1:]...)
		}
	}
	return ms
}

// fill places until NodeB is full once.
func (w *capacityWriter) fill(ctx context.Context) {
	for !w.place(ctx) && w.run.unexpected.Load() == 0 {
	}
}

// churn places and releases at random for ops steps.
func (w *capacityWriter) churn(ctx context.Context, ops int) {
	for range ops {
		if w.rng.IntN(10) < 4 {
			w.place(ctx)
		} else {
			w.releaseOne(ctx)
		}
	}
}

func everyWriter(writers []*capacityWriter, f func(w *capacityWriter)) { capacitytest.Each(writers, f) }

// TestShardCapacityThroughTheStore: NodeB may hold limit actors. 24
// writers through two sharded stores of the same 3 shards (two processes,
// each with its own escrow mover) place actors on it: 16 reserve actors
// whose keys hash to every shard, 8 move rows of theirs onto it with
// aggregates across shards (the moved row in one shard, a preserve row in
// another, the record wherever the aggregate ID hashes). Fill: every writer
// places until refused, and exactly the limit is admitted. Churn: writers
// place and release (abort, delete a moved row) at random while a reclaim
// runs in a loop. Refill: every writer places until refused again, and the
// node is exactly full. The capacity held over all shards never passes the
// limit.
func TestShardCapacityThroughTheStore(t *testing.T) {
	const limit, reservers, aggregators, moversEach, churnOps = 20, 16, 8, 4, 30
	policy := conformance.CapacityPolicyFunc(func(node authority.NodeDescriptor, requested, reserved, active authority.CapacityVector) bool {
		return node != conformance.NodeB || requested.Actors+reserved.Actors+active.Actors <= limit
	})
	shards := shardConfigs(t, clusterCount)
	stores := []*sharded.Store{
		newStore(t, 0, sharded.Config{Shards: shards, CapacityPolicy: policy}),
		newStore(t, 0, sharded.Config{Shards: shards, CapacityPolicy: policy}),
	}
	fx := conformance.NewFixture(t, harnessFor(stores[0], nil))
	run := &capacityRun{}
	var ws []*capacityWriter
	for i := range reservers + aggregators {
		w := &capacityWriter{id: i, s: stores[i%2], rng: rand.New(rand.NewPCG(uint64(i), 42)), run: run}
		if i >= reservers {
			var id string
			w.anchor, id = keyInShard(t, stores[0], (i+1)%clusterCount, fmt.Sprintf("anchor%d", i))
			fx.Active(authority.ObjectActor, id, conformance.TargetA)
			for j := range moversEach {
				key, id := keyInShard(t, stores[0], i%clusterCount, fmt.Sprintf("mover%d-%d", i, j))
				fx.Active(authority.ObjectActor, id, conformance.TargetA)
				w.movers = append(w.movers, &mover{key: key})
			}
		}
		ws = append(ws, w)
	}
	ctx := t.Context()
	requireFull := func(phase string) {
		t.Helper()
		require.Zero(t, run.unexpected.Load(), "%s: %v", phase, run.firstUnexpected.Load())
		u := fx.ActorUsage(conformance.NodeB)
		require.Equal(t, int64(limit), u.Active+u.Reserved, "%s: actors on NodeB over all shards", phase)
		require.Equal(t, int64(limit), run.holding.Load(), phase)
	}

	everyWriter(ws, func(w *capacityWriter) { w.fill(ctx) })
	requireFull("fill")
	require.Equal(t, int64(limit), run.admitted.Load(), "fill admits exactly the limit")

	stop := make(chan struct{})
	var reclaimer sync.WaitGroup
	reclaims := 0
	reclaimer.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := stores[1].ReconcileEscrow(ctx, true); err != nil && !errors.Is(err, authority.ErrUnavailable) {
				run.fail(err)
				return
			}
			reclaims++
		}
	})
	everyWriter(ws, func(w *capacityWriter) { w.churn(ctx, churnOps) })
	close(stop)
	reclaimer.Wait()
	require.Zero(t, run.unexpected.Load(), "churn: %v", run.firstUnexpected.Load())

	everyWriter(ws, func(w *capacityWriter) { w.fill(ctx) })
	requireFull("refill")

	over := max(0, run.peak.Load()-limit)
	e0, e1 := stores[0].EscrowStats(), stores[1].EscrowStats()
	t.Logf("shard-capacity: shards=%d writers=%d limit=%d peak=%d over-admitted=%d admitted=%d moved=%d exhausted=%d unavailable=%d releases=%d grows=%d grants=%d reclaims=%d reclaim-loops=%d",
		clusterCount, len(ws), limit, run.peak.Load(), over, run.admitted.Load(), run.moved.Load(), run.exhausted.Load(), run.retried.Load(),
		run.releases.Load(), e0.Grows+e1.Grows, e0.Grants+e1.Grants, e0.Reclaims+e1.Reclaims, reclaims)
	require.Zero(t, over, "over-admitted")
	require.Equal(t, int64(limit), run.peak.Load(), "the peak is the limit")
	require.NotZero(t, run.moved.Load(), "aggregates moved rows onto the node")
}
