package faults_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdcluster"
	lin "github.com/zlink-systems/authority/internal/testkit/linearizability"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
)

// linRun is how long the clients of the linearizability test run.
// linRun is how long the workload runs at least; it keeps going until the
// nemesis injected both faults and a write was acknowledged (keepGoing).
const linRun = 12 * time.Second

// TestLinearizableUnderFaults runs 8 clients over 3 keys (CAS put/delete,
// reserve/commit/abort, read) through the etcd provider on a 3-member
// cluster while a nemesis kills and restarts the leader and blackholes a
// member, and checks the history with porcupine.
func TestLinearizableUnderFaults(t *testing.T) {
	c, cli := startCluster(t, etcdcluster.Options{})
	const ns = "/faults/lin/"
	admin := newStore(t, cli, ns)
	newClientStore := func() *etcdstore.Store { return newStore(t, c.Client(t), ns) }
	linearizableUnderFaults(t, c, admin, newClientStore, 3, nil)
}

// TestLinearizableUnderFaultsBatched is the same with the 8 clients sharing
// one store that keeps one Txn in flight, so that their writes of distinct
// keys are sent merged (provider/etcd/internal/txnkit/batch.go).
func TestLinearizableUnderFaultsBatched(t *testing.T) {
	c, cli := startCluster(t, etcdcluster.Options{})
	const ns = "/faults/lin-batched/"
	admin := newStore(t, cli, ns)
	ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
	defer cancel()
	shared, err := etcdstore.New(ctx, etcdstore.Config{Client: c.Client(t), Namespace: ns, RequestTimeout: requestTimeout,
		SkipVersionCheck: true, MaxConcurrentTxns: 1})
	if err != nil {
		t.Fatalf("new store: %v", err)
	}
	t.Cleanup(func() { _ = shared.Close() })
	linearizableUnderFaults(t, c, admin, func() *etcdstore.Store { return shared }, 8,
		func() bool { return shared.WriteStats().BatchedWrites > 0 })
	st := shared.WriteStats()
	t.Logf("batching: txns=%d batches=%d batched-writes=%d fallbacks=%d", st.Txns, st.Batches, st.BatchedWrites, st.Fallbacks)
	if st.BatchedWrites == 0 {
		t.Error("no write was sent merged: the run did not test batching")
	}
}

// linearizableUnderFaults runs the workload over keys and checks its
// history; exercised (nil: nothing) is what else the run must have done
// before it may end.
func linearizableUnderFaults(t *testing.T, c *etcdcluster.Cluster, admin *etcdstore.Store, newClientStore func() *etcdstore.Store, keys int, exercised func() bool) {
	tgt := conformance.Target(conformance.NodeA, conformance.NodeLifecycle, authority.OwnerToken{OwnerID: "lin-owner", LeaseGeneration: 1})
	markLive(t, admin, tgt, ownerTTL)

	seed := uint64(time.Now().UnixNano())
	t.Logf("seed=%d", seed)
	w := newWorkload(t, newClientStore, tgt, 8, keyNames("lin-", keys), seed)
	nem := newNemesis(c, seed)

	run := keepGoing(linRun, func() bool {
		faults, _ := nem.injected()
		return faults >= 2 && w.stats.writesAcked.Load() > 0 && (exercised == nil || exercised())
	})
	defer run.stop()
	ctx := run.ctx
	nemErr := make(chan error, 1)
	go func() {
		nemErr <- nem.cycle(ctx, 700*time.Millisecond,
			func(ctx context.Context) error { return nem.killLeader(ctx, 700*time.Millisecond) },
			func(ctx context.Context) error { return nem.partition(ctx, "blackhole", time.Second) },
		)
	}()
	w.run(ctx)
	if err := <-nemErr; err != nil {
		t.Fatalf("nemesis: %v", err)
	}
	_, ran := run.report()
	t.Logf("ran %.1fs (planned %v)", ran.Seconds(), linRun)

	h, n := w.rec.history()
	ok := lin.Check(t, h)
	faults, kinds := nem.injected()
	verdict := "ok"
	if !ok {
		verdict = "violation"
	}
	t.Logf("linearizability: clients=8 keys=%d ops=%d returned=%d unknown=%d discarded=%d acked-writes=%d faults=%d (%s) verdict=%s",
		keys, w.stats.ops.Load(), n.returned, n.unknown, n.discarded, w.stats.writesAcked.Load(), faults, kinds, verdict)
	// negative control: the same history with one read answered by a value
	// nobody wrote must be refused, or the check tests nothing
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
	if faults < 2 {
		t.Errorf("the nemesis injected %d faults; the run needs a leader kill and a blackhole", faults)
	}
	if w.stats.writesAcked.Load() == 0 {
		t.Errorf("no write was acknowledged: the history tests nothing")
	}
}
