package faults_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/internal/testkit/etcdcluster"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/sharded"
)

// The sharded fault tests run one authority store over several etcd
// clusters (package provider/sharded), each cluster its own set of member
// processes (etcdcluster), each shard in the same namespace of its cluster.

// startShardClusters starts one cluster per entry of members (that many
// members each, the other options shared), in parallel.
func startShardClusters(t testing.TB, opts etcdcluster.Options, members ...int) []*etcdcluster.Cluster {
	t.Helper()
	out := make([]*etcdcluster.Cluster, len(members))
	var wg sync.WaitGroup
	for i, n := range members {
		wg.Go(func() {
			o := opts
			o.Members = n
			out[i] = etcdcluster.Start(goroutineTB{t}, o)
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return out
}

// goroutineTB is t for another goroutine of its test: its Fatal fails t
// and ends that goroutine (FailNow may end only the test's own).
type goroutineTB struct{ testing.TB }

func (g goroutineTB) Fatal(args ...any) {
	g.Helper()
	g.Error(args...)
	runtime.Goexit()
}

func (g goroutineTB) Fatalf(format string, args ...any) {
	g.Helper()
	g.Errorf(format, args...)
	runtime.Goexit()
}

func (g goroutineTB) FailNow() {
	g.Fail()
	runtime.Goexit()
}

// shardClients returns a new client of every member of each cluster (closed
// at t's cleanup): what one store process would dial.
func shardClients(t testing.TB, clusters []*etcdcluster.Cluster) []*clientv3.Client {
	t.Helper()
	out := make([]*clientv3.Client, len(clusters))
	for i, c := range clusters {
		out[i] = c.Client(t)
	}
	return out
}

// shardedConfig returns the configuration of a sharded store over clients
// (shard i on clients[i]), namespace ns in every cluster, each request
// bounded by timeout.
func shardedConfig(clients []*clientv3.Client, ns string, timeout time.Duration) sharded.Config {
	cfg := sharded.Config{}
	for _, cli := range clients {
		cfg.Shards = append(cfg.Shards, etcdstore.Config{Client: cli, Namespace: ns, RequestTimeout: timeout, SkipVersionCheck: true})
	}
	return cfg
}

// openSharded opens a sharded store over clusters in namespace ns, on
// clients of its own, each request bounded by timeout; closed at t's
// cleanup.
func openSharded(t testing.TB, clusters []*etcdcluster.Cluster, ns string, timeout time.Duration) *sharded.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
	defer cancel()
	s, err := sharded.New(ctx, shardedConfig(shardClients(t, clusters), ns, timeout))
	if err != nil {
		t.Fatalf("open sharded store: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// idsInShard returns n global IDs "<prefix><i>" (i rising from 0, skipping
// those of other shards) whose kind's keys live in shard.
func idsInShard(t testing.TB, shardOf func(authority.Key) int, kind authority.ObjectKind, prefix string, shard, n int) []string {
	t.Helper()
	var out []string
	for i := 0; len(out) < n; i++ {
		if i > 1000*(n+1) {
			t.Fatalf("no %d IDs of prefix %q in shard %d", n, prefix, shard)
		}
		id := fmt.Sprintf("%s%d", prefix, i)
		if shardOf(objectKey(t, kind, id)) == shard {
			out = append(out, id)
		}
	}
	return out
}

// listSharded lists every row under prefix, page by page (the merged
// listing's cursor), retrying faults.
func listSharded(t testing.TB, st *sharded.Store, prefix string) map[authority.Key]*authority.Snapshot {
	t.Helper()
	rows := map[authority.Key]*authority.Snapshot{}
	var cursor authority.ScanCursor
	for {
		var page authority.ScanResult
		eventually(t, "list", func(ctx context.Context) error {
			var err error
			page, err = st.ListAuthorities(ctx, prefix, cursor, authority.MaxScanLimit)
			return err
		})
		if page.Kind != authority.KindPage {
			t.Fatalf("list %q: %s", prefix, page.Kind)
		}
		for _, it := range page.Items {
			rows[it.Key] = it.Snapshot
		}
		if cursor = page.NextCursor; cursor == "" {
			return rows
		}
	}
}
