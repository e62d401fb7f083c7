package faults_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdcluster"
	"github.com/zlink-systems/authority/provider/sharded"
)

// BenchmarkShards measures reserve+commit pairs (one User Spot each, the
// pair BenchmarkEtcd's reserve-commit times) through one sharded store at
// 64 clients, over one cluster (shards=1) and over three (shards=3), each
// cluster one standalone etcd member process with fsync on; and one
// cluster driven by 21 clients (one-shard-of-3: what one shard of three
// gets of 64 clients), the per-shard figure a projection to separate
// machines starts from (docs/scale.md, "Past one cluster"). Every
// sub-benchmark reports pairs/s, the p50 and p99 of a pair, and writes per
// etcd Txn. All clusters share this machine's cores with the clients. One
// run:
//
//	go test ./faults/ -run '^$' -bench BenchmarkShards -benchtime 6000x -count 1
func BenchmarkShards(b *testing.B) {
	clusters := startShardClusters(b, etcdcluster.Options{Fsync: true}, 1, 1, 1)
	b.Run("shards=1", func(b *testing.B) { benchShards(b, clusters[:1], 64, true) })
	b.Run("shards=3", func(b *testing.B) { benchShards(b, clusters, 64, true) })
	// the same store with capacity escrow on (a store that may take a
	// capacity policy): every reservation a group commit fenced on its
	// node's budget slice
	b.Run("shards=3-escrow", func(b *testing.B) { benchShards(b, clusters, 64, false) })
	b.Run("one-shard-of-3", func(b *testing.B) { benchShards(b, clusters[:1], 21, true) })
}

var benchShardsRun int

// benchShards runs b.N pairs from clients goroutines through one sharded
// store over clusters, in a fresh namespace; noPolicy opens it with
// NoCapacityPolicy (no capacity escrow).
func benchShards(b *testing.B, clusters []*etcdcluster.Cluster, clients int, noPolicy bool) {
	benchShardsRun++
	ns := fmt.Sprintf("/faults/bench-shards/%d/", benchShardsRun)
	cfg := shardedConfig(shardClients(b, clusters), ns, 30*time.Second)
	cfg.NoCapacityPolicy = noPolicy
	st, err := sharded.New(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = st.Close() })
	ctx := context.Background()
	tgt := conformance.TargetA
	if err := st.MarkLive(ctx, tgt.Descriptor(), tgt.NodeLifecycleGeneration, tgt.Owner, time.Hour); err != nil {
		b.Fatal(err)
	}
	for s := range st.Shards() { // grants each shard's terminal lease
		id := idsInShard(b, st.ShardOf, authority.ObjectUserSpot, "warm-", s, 1)[0]
		if err := benchPair(ctx, st, tgt, id); err != nil {
			b.Fatal(err)
		}
	}
	txns, writes := benchWrites(st)
	lat := make([][]time.Duration, clients)
	errs := make([]error, clients)
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for c := range clients {
		n := b.N / clients
		if c < b.N%clients {
			n++
		}
		wg.Go(func() {
			for i := range n {
				t0 := time.Now()
				if err := benchPair(ctx, st, tgt, fmt.Sprintf("rc-%d-%d", c, i)); err != nil {
					errs[c] = err
					return
				}
				lat[c] = append(lat[c], time.Since(t0))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if err := errors.Join(errs...); err != nil {
		b.Fatal(err)
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "pairs/s")
	b.ReportMetric(benchPercentile(all, 0.50), "p50-ms")
	b.ReportMetric(benchPercentile(all, 0.99), "p99-ms")
	if t2, w2 := benchWrites(st); t2 > txns {
		b.ReportMetric(float64(w2-writes)/float64(t2-txns), "writes/Txn")
	}
}

// benchPair reserves and commits the User Spot id on tgt.
func benchPair(ctx context.Context, st *sharded.Store, tgt authority.CreationTarget, id string) error {
	req := reserveRequest(authority.ObjectUserSpot, id, tgt, "creating")
	res, err := st.Reserve(ctx, req)
	if err != nil {
		return err
	}
	if res.Kind != authority.KindReserved {
		return fmt.Errorf("reserve %s: %s", id, res.Kind)
	}
	c, err := st.Commit(ctx, reservation{req: req, id: res.ReservationID, row: res.Creating}.commit("ready"))
	if err != nil {
		return err
	}
	if c.Kind != authority.KindCommitted {
		return fmt.Errorf("commit %s: %s", id, c.Kind)
	}
	return nil
}

// benchWrites sums the write Txns the shards' stores sent and the writes
// they carried (a merged Txn carries several).
func benchWrites(st *sharded.Store) (txns, writes int64) {
	for i := range st.Shards() {
		ws := st.Shard(i).WriteStats()
		txns += ws.Txns
		writes += ws.Txns - ws.Batches + ws.BatchedWrites
	}
	return txns, writes
}

func benchPercentile(sorted []time.Duration, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := min(len(sorted)-1, int(q*float64(len(sorted))))
	return float64(sorted[i]) / float64(time.Millisecond)
}
