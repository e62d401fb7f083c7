package faults_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdcluster"
	lin "github.com/zlink-systems/authority/internal/testkit/linearizability"
	"github.com/zlink-systems/authority/provider/sharded"
)

// shardLinKeysPerShard is how many of the linearizability keys live in each
// shard.
const shardLinKeysPerShard = 2

// TestShardLinearizableLeaderKill runs 8 clients, each its own sharded
// store on clients of its own, over 6 keys, 2 in each of three shards —
// shard 0 a 3-member cluster, shards 1 and 2 one member each — issuing CAS
// put/delete, reserve/commit/abort and reads, while a nemesis kills shard
// 0's leader (SIGKILL) and restarts it, again and again. Porcupine checks
// the history (one model, partitioned by key). The run keeps going past
// its planned time until the leader was killed twice and writes of every
// shard were acknowledged. It prints
//
//	linearizability: shards=3 clients=8 keys=6 ops=… acked-writes=… (by shard …) leader-kills=… verdict=ok
func TestShardLinearizableLeaderKill(t *testing.T) {
	clusters := startShardClusters(t, etcdcluster.Options{}, 3, 1, 1)
	const ns = "/faults/shard-lin/"
	admin := openSharded(t, clusters, ns, requestTimeout)
	tgt := conformance.Target(conformance.NodeA, conformance.NodeLifecycle, authority.OwnerToken{OwnerID: "shard-lin-owner", LeaseGeneration: 1})
	eventually(t, "mark live", func(ctx context.Context) error {
		return admin.MarkLive(ctx, tgt.Descriptor(), tgt.NodeLifecycleGeneration, tgt.Owner, ownerTTL)
	})
	var keys []string
	for s := range clusters {
		keys = append(keys, idsInShard(t, admin.ShardOf, authority.ObjectUserSpot, fmt.Sprintf("slin-%d-", s), s, shardLinKeysPerShard)...)
	}

	seed := uint64(time.Now().UnixNano())
	t.Logf("seed=%d", seed)
	w := newWorkload(t, func() *sharded.Store { return openSharded(t, clusters, ns, requestTimeout) }, tgt, 8, keys, seed)
	nem := newNemesis(clusters[0], seed)
	byShard := func() []int {
		out := make([]int, len(clusters))
		for key, n := range w.rec.ackedWrites() {
			out[admin.ShardOf(objectKey(t, authority.ObjectUserSpot, key))] += n
		}
		return out
	}
	run := keepGoing(linRun, func() bool {
		faults, _ := nem.injected()
		return faults >= 2 && !slices.Contains(byShard(), 0)
	})
	defer run.stop()
	nemErr := make(chan error, 1)
	go func() {
		nemErr <- nem.cycle(run.ctx, 700*time.Millisecond,
			func(ctx context.Context) error { return nem.killLeader(ctx, 700*time.Millisecond) })
	}()
	w.run(run.ctx)
	if err := <-nemErr; err != nil {
		t.Fatalf("nemesis: %v", err)
	}
	_, ran := run.report()
	t.Logf("ran %.1fs (planned %v)", ran.Seconds(), linRun)

	h, n := w.rec.history()
	verdict := "ok"
	if !lin.Check(t, h) {
		verdict = "violation"
	}
	faults, _ := nem.injected()
	acked := byShard()
	t.Logf("linearizability: shards=%d clients=8 keys=%d ops=%d returned=%d unknown=%d discarded=%d acked-writes=%d (by shard %v) leader-kills=%d verdict=%s",
		len(clusters), len(keys), w.stats.ops.Load(), n.returned, n.unknown, n.discarded, w.stats.writesAcked.Load(), acked, faults, verdict)
	requireForgedReadRefused(t, w.rec)
	if faults < 2 {
		t.Errorf("the nemesis killed shard 0's leader %d times; the run needs 2", faults)
	}
	for s, a := range acked {
		if a == 0 {
			t.Errorf("no write of shard %d was acknowledged: the history tests nothing there", s)
		}
	}
}

// requireForgedReadRefused is the negative control: the history with one
// read answered by a value nobody wrote must be refused, or the check
// tests nothing.
func requireForgedReadRefused(t *testing.T, rec *recorder) {
	t.Helper()
	mutated := rec.withForgedRead()
	if mutated == nil {
		t.Error("no successful read of a row in the history")
		return
	}
	result, path, err := lin.Verdict(mutated, lin.DefaultTimeout)
	if path != "" {
		_ = os.Remove(path)
	}
	if err != nil || result != porcupine.Illegal {
		t.Errorf("a history with a forged read was judged %s (%v): the check is vacuous", result, err)
	}
}

// ackedWrites counts, by key, the writes whose success was returned.
func (r *recorder) ackedWrites() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]int{}
	for _, op := range r.ops {
		if op.end != endReturned {
			continue
		}
		switch op.out.Kind {
		case authority.KindStored, authority.KindDeleted, authority.KindReserved, authority.KindCommitted, authority.KindAborted:
			out[op.in.Key]++
		}
	}
	return out
}
