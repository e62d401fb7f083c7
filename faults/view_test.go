package faults_test

import (
	"context"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	clientv3 "go.etcd.io/etcd/client/v3"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdcluster"
	lin "github.com/zlink-systems/authority/internal/testkit/linearizability"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/view"
)

// viewStaleBound is the bound of the bounded-stale reads the View test
// checks.
const viewStaleBound = 300 * time.Millisecond

// TestViewLinearizableUnderFaults runs the linearizability workload (8
// clients over 3 keys, CAS put/delete, reserve/commit/abort, read) with the
// reads of half the clients answered by one local read view (consistent
// reads), while a nemesis kills the leader, blackholes a member, compacts
// to the current revision (the view's feed must relist when it is behind)
// and drops a member's traffic (watch streams break and resume). Porcupine
// checks the history. Meanwhile a reader checks bounded-stale view reads
// against their bound: each answer reflects a revision at least the one
// the store had viewStaleBound before the read, and the row it returns is
// the row at the revision it names.
func TestViewLinearizableUnderFaults(t *testing.T) {
	c, cli := startCluster(t, etcdcluster.Options{})
	const ns = "/faults/view/"
	admin := newStore(t, cli, ns)
	tgt := conformance.Target(conformance.NodeA, conformance.NodeLifecycle, authority.OwnerToken{OwnerID: "view-owner", LeaseGeneration: 1})
	markLive(t, admin, tgt, ownerTTL)

	vctx, vcancel := context.WithTimeout(context.Background(), settleTimeout)
	v, err := view.New(vctx, newStore(t, c.Client(t), ns), view.Config{Prefix: "user_spot/", MaxWait: time.Second})
	vcancel()
	if err != nil {
		t.Fatalf("view: %v", err)
	}
	t.Cleanup(func() { _ = v.Close() })

	seed := uint64(time.Now().UnixNano())
	t.Logf("seed=%d", seed)
	const keys = 3
	w := newWorkload(t, func() *etcdstore.Store { return newStore(t, c.Client(t), ns) }, tgt, 8, keyNames("view-", keys), seed)
	viewReads := &countingReader{v: v}
	for _, cl := range w.clients[:4] {
		cl.reader = viewReads
	}
	nem := newNemesis(c, seed)
	var compactions atomic.Int64
	ctx, cancel := context.WithTimeout(context.Background(), linRun)
	defer cancel()
	nemErr := make(chan error, 1)
	go func() {
		nemErr <- nem.cycle(ctx, 700*time.Millisecond,
			func(ctx context.Context) error { return nem.killLeader(ctx, 700*time.Millisecond) },
			func(ctx context.Context) error { return compactNowOn(ctx, cli, &compactions) },
			func(ctx context.Context) error { return nem.partition(ctx, "blackhole", time.Second) },
			func(ctx context.Context) error { return nem.partition(ctx, "drop", time.Second) },
		)
	}()
	stale := &staleChecker{t: t, v: v, cli: cli, layout: schema.NewLayout(ns), key: "user_spot/view-0"}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); stale.run(ctx, admin) }()
	w.run(ctx)
	wg.Wait()
	if err := <-nemErr; err != nil {
		t.Fatalf("nemesis: %v", err)
	}

	h, n := w.rec.history()
	ok := lin.Check(t, h)
	faults, kinds := nem.injected()
	st := v.Stats()
	verdict := "ok"
	if !ok {
		verdict = "violation"
	}
	t.Logf("linearizability: view clients=8 (4 reading through the view) keys=%d ops=%d returned=%d unknown=%d discarded=%d acked-writes=%d faults=%d (%s compaction=%d) view: reads=%d relists=%d resumes=%d store-reads=%d stale-reads=%d verdict=%s",
		keys, w.stats.ops.Load(), n.returned, n.unknown, n.discarded, w.stats.writesAcked.Load(), faults+int(compactions.Load()), kinds,
		compactions.Load(), viewReads.n.Load(), st.Relists, st.Resumes, st.StoreReads, stale.checked.Load(), verdict)
	// negative control: a read answered by a value nobody wrote must be
	// refused, or the check tests nothing
	if mutated := w.rec.withForgedRead(); mutated != nil {
		result, path, err := lin.Verdict(mutated, lin.DefaultTimeout)
		if path != "" {
			_ = os.Remove(path)
		}
		if err != nil || result != porcupine.Illegal {
			t.Errorf("a history with a forged read was judged %s (%v): the check is vacuous", result, err)
		}
	} else {
		t.Error("no successful read of a row in the history")
	}
	if viewReads.n.Load() == 0 {
		t.Error("no read went through the view")
	}
	if faults < 2 || compactions.Load() == 0 {
		t.Errorf("the nemesis injected %d faults and %d compactions; the run needs each kind", faults, compactions.Load())
	}
	if stale.checked.Load() == 0 {
		t.Error("no bounded-stale read was checked")
	}
}

// countingReader counts the consistent reads a view answered.
type countingReader struct {
	v *view.View
	n atomic.Int64
}

// ReadAuthority reads through the view.
func (r *countingReader) ReadAuthority(ctx context.Context, key authority.Key) (authority.ReadResult, error) {
	res, err := r.v.ReadAuthority(ctx, key)
	if err == nil {
		r.n.Add(1)
	}
	return res, err
}

// compactNowOn compacts the cluster at its current revision.
func compactNowOn(ctx context.Context, cli *clientv3.Client, n *atomic.Int64) error {
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	resp, err := cli.Get(rctx, "/faults/view-compaction-probe")
	if err == nil {
		_, err = cli.Compact(rctx, resp.Header.Revision)
	}
	if err == nil {
		n.Add(1)
	}
	return nil // a compaction the faults prevented is not a failure
}

// staleChecker reads one key from the view with viewStaleBound and checks
// each answer against the store.
type staleChecker struct {
	t       *testing.T
	v       *view.View
	cli     *clientv3.Client
	layout  schema.Layout
	key     authority.Key
	checked atomic.Int64

	mu      sync.Mutex
	samples []revSample // the store's revision, learned by time
}

// revSample is a revision the store had when a request that ended at done
// began.
type revSample struct {
	done time.Time
	rev  int64
}

// run samples the store's revision and checks stale reads until ctx ends.
func (s *staleChecker) run(ctx context.Context, admin *etcdstore.Store) {
	go func() {
		for ctx.Err() == nil {
			rctx, cancel := context.WithTimeout(ctx, requestTimeout)
			rev, err := admin.FeedRevision(rctx)
			cancel()
			if err == nil {
				s.mu.Lock()
				s.samples = append(s.samples, revSample{done: time.Now(), rev: rev})
				s.mu.Unlock()
			}
			sleepCtx(ctx, 20*time.Millisecond)
		}
	}()
	for sleepCtx(ctx, 10*time.Millisecond) {
		s.check(ctx)
	}
}

// check makes one stale read and checks it.
func (s *staleChecker) check(ctx context.Context) {
	start := time.Now()
	rctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	r, err := s.v.Read(rctx, s.key, view.Freshness{MaxStaleness: viewStaleBound})
	if err != nil || r.FromStore {
		return
	}
	var floor int64 // the store's revision viewStaleBound before the read
	s.mu.Lock()
	for _, smp := range s.samples {
		if smp.done.Before(start.Add(-viewStaleBound)) {
			floor = max(floor, smp.rev)
		}
	}
	s.mu.Unlock()
	if r.Revision < floor {
		s.t.Errorf("stale read at revision %d; the store was at %d more than %v before it", r.Revision, floor, viewStaleBound)
	}
	got, err := s.cli.Get(rctx, s.layout.Row(s.key), clientv3.WithRev(r.Revision))
	if err != nil {
		return // compacted, or a fault: nothing to compare with
	}
	var want authority.StoreVersion
	if len(got.Kvs) > 0 {
		want = schema.Version(got.Kvs[0].ModRevision)
	}
	var have authority.StoreVersion
	if r.Kind == authority.KindSnapshot {
		have = r.Snapshot.StoreVersion
	}
	if have != want {
		s.t.Errorf("view answered %q at revision %d; the store had %q there", have, r.Revision, want)
	}
	s.checked.Add(1)
}
