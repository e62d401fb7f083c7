package faults_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/capacitytest"
	"github.com/zlink-systems/authority/internal/testkit/etcdcluster"
	etcd "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/sharded"
	"github.com/zlink-systems/authority/provider/sharded/escrow"
)

const (
	// shardCapWriters reserve against one node: a third on each shard,
	// spread over shardCapSets store sets (each a process's stores and
	// mover), half of them actors, half User Spots.
	shardCapWriters = 36
	shardCapSets    = 3
	// the node's limits: monotone on the totals, as escrow assumes
	shardCapActors, shardCapSpots = 30, 45
	// shardCapChurnOps is each writer's random operations in the churn.
	shardCapChurnOps = 40
	// shardCapSoakRounds is how often the churn and refill run with
	// AUTHORITY_SOAK set (twice without).
	shardCapSoakRounds = 10
)

// capLimits is a capacity policy with a limit on the actors and one on the
// Spots of every type of a node.
type capLimits struct{ actors, spots int64 }

func (l capLimits) PlacementCapacityAvailable(_ authority.NodeDescriptor, requested, reserved, active authority.CapacityVector) bool {
	return requested.Actors+reserved.Actors+active.Actors <= l.actors && requested.Spots+reserved.Spots+active.Spots <= l.spots
}

// capSet is one process's view of the namespace: a store per shard, in
// escrow mode, on clients of its own, and the mover they share.
type capSet struct {
	stores []*etcd.Store
	mover  *escrow.Mover
}

// openCapSet opens a store set over clusters in namespace ns under policy.
func openCapSet(t *testing.T, clusters []*etcdcluster.Cluster, ns string, policy authority.CapacityPolicy) *capSet {
	t.Helper()
	m, err := escrow.New(escrow.Config{Shards: len(clusters)})
	if err != nil {
		t.Fatal(err)
	}
	set := &capSet{mover: m}
	for i, c := range clusters {
		s, err := etcd.New(settle(t), etcd.Config{Client: c.Client(t), Namespace: ns, RequestTimeout: outageWriteTimeout,
			SkipVersionCheck: true, CapacityPolicy: policy, CapacityEscrow: m.Hook(i), ShardMember: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		if err := m.Attach(i, s.Budget()); err != nil {
			t.Fatal(err)
		}
		set.stores = append(set.stores, s)
	}
	return set
}

// capRun counts what the writers saw. holding is, per kind (actors,
// Spots), a lower bound of the capacity held over all shards at once: +1
// once a reservation is acknowledged, -1 before its release is sent; peak
// is its highest value.
type capRun struct {
	holding, peak                             [2]atomic.Int64
	admitted, exhausted, unavailable, unknown atomic.Int64
	releases, commits, unexpected             atomic.Int64
	firstUnexpected                           atomic.Value
	limits                                    [2]int64
}

func capKind(kind authority.ObjectKind) int {
	if kind == authority.ObjectActor {
		return 0
	}
	return 1
}

func (r *capRun) took(kind authority.ObjectKind) {
	i := capKind(kind)
	capacitytest.Took(&r.holding[i], &r.peak[i])
	r.admitted.Add(1)
}

func (r *capRun) fail(err error) {
	r.unexpected.Add(1)
	r.firstUnexpected.CompareAndSwap(nil, err.Error())
}

// capHeld is a row a writer holds: reserved, or active after a commit.
type capHeld struct {
	req    authority.ReserveRequest
	resID  string
	row    *authority.Snapshot
	active bool
}

// capWriter is one writer: its store (of its shard, in its set), its kind
// and the rows it holds.
type capWriter struct {
	id, shard int
	store     *etcd.Store
	shardOf   func(authority.Key) int
	kind      authority.ObjectKind
	tgt       authority.CreationTarget
	rows      []capHeld
	seq       int
	rng       *rand.Rand
	run       *capRun
}

// nextRequest returns a reservation of a new row of the writer's shard.
func (w *capWriter) nextRequest() authority.ReserveRequest {
	for {
		w.seq++
		id := fmt.Sprintf("w%d-%d", w.id, w.seq)
		if key, err := authority.EncodeKey(w.kind, id); err == nil && w.shardOf(key) == w.shard {
			return reserveRequest(w.kind, id, w.tgt, "creating-"+id)
		}
	}
}

// reserve reserves a new row: true when the node was exhausted.
func (w *capWriter) reserve() (exhausted bool) {
	req := w.nextRequest()
	ctx, cancel := context.WithTimeout(context.Background(), outageWriteTimeout)
	defer cancel()
	res, err := w.store.Reserve(ctx, req)
	switch {
	case errors.Is(err, authority.ErrUnavailable):
		w.run.unavailable.Add(1) // not sent: contention on the node's budget
	case errors.Is(err, authority.ErrOutcomeUnknown):
		w.run.unknown.Add(1)
		w.adoptIfApplied(req)
	case err != nil:
		w.run.fail(err)
	case res.Kind == authority.KindReserved:
		w.run.took(w.kind)
		w.rows = append(w.rows, capHeld{req: req, resID: res.ReservationID, row: res.Creating})
	case res.Kind == authority.KindPlacementCapacityExhausted:
		w.run.exhausted.Add(1)
		return true
	default:
		w.run.fail(fmt.Errorf("reserve: %s", res.Kind))
	}
	return false
}

// adoptIfApplied reads back a reservation of unknown outcome and holds its
// row when it was applied.
func (w *capWriter) adoptIfApplied(req authority.ReserveRequest) {
	key, _ := req.Key.Encode()
	ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
	defer cancel()
	read, err := w.store.ReadAuthority(ctx, key)
	switch {
	case err != nil:
		w.run.fail(fmt.Errorf("read back %s: %w", key, err))
	case read.Kind == authority.KindSnapshot && read.Snapshot.PendingCreation != nil && string(read.Snapshot.Payload) == string(req.CreatingPayload):
		w.run.took(w.kind)
		w.rows = append(w.rows, capHeld{req: req, resID: read.Snapshot.PendingCreation.ReservationID, row: read.Snapshot})
	}
}

// commitOne turns one reserved Spot active.
func (w *capWriter) commitOne() {
	for i := range w.rows {
		h := &w.rows[i]
		if h.active || !w.kind.IsSpot() {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), outageWriteTimeout)
		res, err := w.store.Commit(ctx, reservation{req: h.req, id: h.resID, row: h.row}.commit("ready"))
		cancel()
		if err != nil || res.Kind != authority.KindCommitted {
			w.run.fail(fmt.Errorf("commit: %v %v", res.Kind, err))
			return
		}
		h.row, h.active = res.Ready, true
		w.run.commits.Add(1)
		return
	}
}

// releaseOne aborts a reserved row or deletes an active one; its capacity
// stops counting as held before the release is sent.
func (w *capWriter) releaseOne() {
	if len(w.rows) == 0 {
		return
	}
	i := w.rng.IntN(len(w.rows))
	h := w.rows[i]
	w.rows = append(w.rows[:i], w.rows[i+1:]...)
	w.run.holding[capKind(w.kind)].Add(-1)
	w.run.releases.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), outageWriteTimeout)
	defer cancel()
	if h.active {
		key, _ := h.req.Key.Encode()
		res, err := w.store.CompareExchangeAuthority(ctx, key, h.row.StoreVersion, authority.Delete())
		if err != nil || res.Kind != authority.KindDeleted {
			w.run.fail(fmt.Errorf("delete: %v %v", res.Kind, err))
		}
		return
	}
	res, err := w.store.Abort(ctx, reservation{req: h.req, id: h.resID, row: h.row}.abort())
	if err != nil || res.Kind != authority.KindAborted {
		w.run.fail(fmt.Errorf("abort: %v %v", res.Kind, err))
	}
}

// fill reserves until the node is exhausted once.
func (w *capWriter) fill() {
	for !w.reserve() && w.run.unexpected.Load() == 0 {
	}
}

// churn reserves, commits and releases at random for ops steps.
func (w *capWriter) churn(ops int) {
	for range ops {
		switch r := w.rng.IntN(10); {
		case r < 4:
			w.reserve()
		case r < 6:
			w.commitOne()
		default:
			w.releaseOne()
		}
	}
}

// eachWriter runs f on every writer at once.
func eachWriter(ws []*capWriter, f func(w *capWriter)) { capacitytest.Each(ws, f) }

// TestShardCapacityExact: one node's limits (30 actors, 45 Spots) over
// three clusters (one member each) in escrow mode (package
// provider/sharded/escrow): 36 writers, 12 on each shard, through three
// store sets (each a process's stores and mover, on clients of their own),
// reserve against them. Fill: every writer reserves until refused, and
// exactly the limits are held. Churn: writers reserve, commit, abort and
// delete at random while one mover reclaims every shard's slack in a loop.
// Refill: shard 0's writers reserve until refused, and the node is exactly
// full again (the other shards' slack came back). Churn and refill run
// twice (10 times with AUTHORITY_SOAK set). Then every transfer is
// finished and, reclaimed, the ledger grants exactly the usage. Over it all,
// the capacity the writers held at once (acknowledged and not yet
// released) never passed a limit, and replaying each cluster's history
// (its capacity entries, its budget slice and, in the node's home shard,
// its ledger) the usage in each shard never passed its slice at any
// revision, the ledger never granted past a limit, and no cumulative count
// ever went down. It prints
//
//	shard-capacity: shards=3 sets=3 writers=36 limit=75 peak=… over-admitted=0 …
func TestShardCapacityExact(t *testing.T) {
	clusters := startShardClusters(t, etcdcluster.Options{}, 1, 1, 1)
	const ns = "/faults/shard-capacity/"
	policy := capLimits{actors: shardCapActors, spots: shardCapSpots}
	// the shard map as a sharded store writes it, and its placement of keys
	admin := openSharded(t, clusters, ns, outageWriteTimeout)
	tgt := conformance.TargetA
	eventually(t, "mark live", func(ctx context.Context) error {
		return admin.MarkLive(ctx, tgt.Descriptor(), tgt.NodeLifecycleGeneration, tgt.Owner, ownerTTL)
	})
	raws := shardClients(t, clusters)
	start := make([]int64, len(clusters))
	for i, cli := range raws {
		resp, err := cli.Get(settle(t), ns+"start")
		if err != nil {
			t.Fatal(err)
		}
		start[i] = resp.Header.Revision
	}
	sets := make([]*capSet, shardCapSets)
	for i := range sets {
		sets[i] = openCapSet(t, clusters, ns, policy)
	}
	run := &capRun{limits: [2]int64{shardCapActors, shardCapSpots}}
	var ws []*capWriter
	for i := range shardCapWriters {
		shard := i % len(clusters)
		ws = append(ws, &capWriter{id: i, shard: shard, store: sets[i/len(clusters)%shardCapSets].stores[shard], shardOf: admin.ShardOf,
			kind: []authority.ObjectKind{authority.ObjectActor, authority.ObjectUserSpot}[i/2%2], tgt: tgt,
			rng: rand.New(rand.NewPCG(uint64(i), 42)), run: run})
	}

	eachWriter(ws, func(w *capWriter) { w.fill() })
	requireCapFull(t, admin, run, "fill")
	rounds, reclaims := 2, int64(0)
	if soak() {
		rounds = shardCapSoakRounds
	}
	for round := range rounds {
		reclaims += churnWithReclaims(t, ws, sets[1].mover, run)
		var first []*capWriter
		for _, w := range ws {
			if w.shard == 0 {
				first = append(first, w)
			}
		}
		eachWriter(first, func(w *capWriter) { w.fill() })
		requireCapFull(t, admin, run, fmt.Sprintf("refill %d", round))
	}
	requireEscrowSettled(t, sets[0], tgt)

	replay := replayEscrow(t, raws, ns, start, escrow.HomeShard(tgt.Descriptor(), len(clusters)), policy, tgt)
	over := max(0, run.peak[0].Load()-shardCapActors) + max(0, run.peak[1].Load()-shardCapSpots) + int64(replay.violations)
	var grows, grants, reclaimed int64
	for _, s := range sets {
		st := s.mover.Stats()
		grows, grants, reclaimed = grows+st.Grows, grants+st.Grants, reclaimed+st.Reclaims
	}
	t.Logf("shard-capacity: shards=%d sets=%d writers=%d limit=%d (actors %d, spots %d) peak=%d over-admitted=%d replayed-revisions=%d admitted=%d exhausted=%d unavailable=%d unknown=%d releases=%d commits=%d grows=%d grants=%d reclaims=%d reclaim-loops=%d",
		len(clusters), shardCapSets, shardCapWriters, shardCapActors+shardCapSpots, shardCapActors, shardCapSpots,
		run.peak[0].Load()+run.peak[1].Load(), over, replay.revisions, run.admitted.Load(), run.exhausted.Load(), run.unavailable.Load(),
		run.unknown.Load(), run.releases.Load(), run.commits.Load(), grows, grants, reclaimed, reclaims)
	if over != 0 {
		t.Errorf("over-admitted: %d", over)
	}
	if run.peak[0].Load() != shardCapActors || run.peak[1].Load() != shardCapSpots {
		t.Errorf("peaks %d actors, %d Spots: the node was never full", run.peak[0].Load(), run.peak[1].Load())
	}
}

// churnWithReclaims runs every writer's churn while mover reclaims every
// shard's slack in a loop; it returns how many reclaim loops ran.
func churnWithReclaims(t *testing.T, ws []*capWriter, mover *escrow.Mover, run *capRun) int64 {
	t.Helper()
	stop := make(chan struct{})
	var loops atomic.Int64
	var reclaimer sync.WaitGroup
	reclaimer.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
			_, err := mover.ReconcileAll(ctx, true)
			cancel()
			if err != nil && !errors.Is(err, authority.ErrUnavailable) {
				run.fail(fmt.Errorf("reclaim: %w", err))
				return
			}
			loops.Add(1)
		}
	})
	eachWriter(ws, func(w *capWriter) { w.churn(shardCapChurnOps) })
	close(stop)
	reclaimer.Wait()
	if run.unexpected.Load() != 0 {
		t.Fatalf("churn: %v", run.firstUnexpected.Load())
	}
	return loops.Load()
}

// requireCapFull requires the node to hold exactly its limits over all
// shards, as etcd counts them and as the writers were told.
func requireCapFull(t *testing.T, st *sharded.Store, run *capRun, phase string) {
	t.Helper()
	if run.unexpected.Load() != 0 {
		t.Fatalf("%s: %v", phase, run.firstUnexpected.Load())
	}
	for i, kind := range []authority.ObjectKind{authority.ObjectActor, authority.CounterSpots} {
		var u authority.CapacityUsage
		eventually(t, "capacity usage", func(ctx context.Context) error {
			var err error
			u, err = st.CapacityUsage(ctx, conformance.NodeA, conformance.NodeLifecycle, kind, "")
			return err
		})
		if u.Active+u.Reserved != run.limits[i] || run.holding[i].Load() != run.limits[i] {
			t.Fatalf("%s: %s held over all shards: %d in etcd (active %d), %d acknowledged; want the limit %d",
				phase, kind, u.Active+u.Reserved, u.Active, run.holding[i].Load(), run.limits[i])
		}
	}
}

// requireEscrowSettled finishes every transfer (a reconcile), then gives
// every shard's slack back (a reclaim), and requires the ledger and the
// slices to agree: every shard received what the ledger gave it and the
// ledger took back what it returned; reclaimed, the ledger grants exactly
// the usage over all shards.
func requireEscrowSettled(t *testing.T, set *capSet, tgt authority.CreationTarget) {
	t.Helper()
	node, lc := tgt.Descriptor(), tgt.NodeLifecycleGeneration
	for _, reclaim := range []bool{false, true} {
		eventually(t, "reconcile", func(ctx context.Context) error {
			_, err := set.mover.ReconcileAll(ctx, reclaim)
			return err
		})
	}
	home := escrow.HomeShard(node, len(set.stores))
	var led schema.BudgetLedger
	eventually(t, "ledger", func(ctx context.Context) error {
		var err error
		led, err = set.stores[home].Budget().Ledger(ctx, node, lc)
		return err
	})
	total := schema.Budget{}
	for i, s := range set.stores {
		var st etcd.SliceState
		eventually(t, "slice", func(ctx context.Context) error {
			var err error
			st, err = s.Budget().Slice(ctx, node, lc)
			return err
		})
		line := led.Shards[i]
		if !budgetEqual(line.Given, st.Slice.Received) || !budgetEqual(line.Taken, st.Slice.Returned) {
			t.Errorf("shard %d: ledger gave %v took %v, slice received %v returned %v", i, line.Given, line.Taken, st.Slice.Received, st.Slice.Returned)
		}
		if !budgetEqual(st.Usage, st.Slice.Size()) {
			t.Errorf("shard %d: slack left after the reclaim: usage %v, slice %v", i, st.Usage, st.Slice.Size())
		}
		total = total.Plus(st.Usage)
	}
	if !budgetEqual(total, led.Granted()) {
		t.Errorf("the ledger grants %v, the usage over all shards is %v", led.Granted(), total)
	}
}

// capReplay is what replaying the clusters' histories found.
type capReplay struct {
	revisions, violations int
}

// replayEscrow replays every change of the capacity entries and escrow keys
// of each shard since start[i] (etcd's history; these clusters never
// compact) and counts the revisions at which a shard's usage was over its
// slice, the home shard's ledger granted over a limit, or a cumulative
// count went down.
func replayEscrow(t *testing.T, raws []*clientv3.Client, ns string, start []int64, home int, limits capLimits, tgt authority.CreationTarget) capReplay {
	t.Helper()
	var out capReplay
	for i, cli := range raws {
		r := newEscrowReplay(ns, tgt, i == home, limits)
		replayRange(t, cli, ns+"capacity", ns+"capacity0", start[i], r.apply, func(rev int64) {
			out.revisions++
			if err := r.check(); err != nil {
				out.violations++
				t.Errorf("shard %d at revision %d: %v", i, rev, err)
			}
		})
	}
	return out
}

// budgetEqual reports whether a and b hold the same counts (an absent
// counter counts 0).
func budgetEqual(a, b schema.Budget) bool { return a.Covers(b) && b.Covers(a) }
