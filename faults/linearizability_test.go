package faults_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/etcdcluster"
	lin "github.com/zlink-systems/authority/internal/linearizability"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
)

// linRun is how long the clients of the linearizability test run.
const linRun = 12 * time.Second

// TestLinearizableUnderFaults runs 8 clients over 3 keys (CAS put/delete,
// reserve/commit/abort, read) through the etcd provider on a 3-member
// cluster while a nemesis kills and restarts the leader and blackholes a
// member, and checks the history with porcupine.
func TestLinearizableUnderFaults(t *testing.T) {
	c, cli := startCluster(t, etcdcluster.Options{})
	const ns = "/faults/lin/"
	admin := newStore(t, cli, ns)
	tgt := conformance.Target(conformance.NodeA, conformance.NodeLifecycle, authority.OwnerToken{OwnerID: "lin-owner", LeaseGeneration: 1})
	markLive(t, admin, tgt, ownerTTL)

	seed := uint64(time.Now().UnixNano())
	t.Logf("seed=%d", seed)
	w := newWorkload(t, func() *etcdstore.Store { return newStore(t, c.Client(t), ns) }, tgt, 8, keyNames("lin-", 3), seed)
	nem := newNemesis(c, seed)

	ctx, cancel := context.WithTimeout(context.Background(), linRun)
	defer cancel()
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

	h, n := w.rec.history()
	ok := lin.Check(t, h)
	faults, kinds := nem.injected()
	verdict := "ok"
	if !ok {
		verdict = "violation"
	}
	t.Logf("linearizability: clients=8 keys=3 ops=%d returned=%d unknown=%d discarded=%d acked-writes=%d faults=%d (%s) verdict=%s",
		w.stats.ops.Load(), n.returned, n.unknown, n.discarded, w.stats.writesAcked.Load(), faults, kinds, verdict)
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
