package faults_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdcluster"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
)

// failoverMaxTxnOps is the cluster's and the stores' --max-txn-ops in the
// failover test (the README's recommended value).
const failoverMaxTxnOps = 1024

// failoverRows is how many rows the failing node holds:
// AUTHORITY_FAILOVER_ROWS, else 10k.
func failoverRows(t *testing.T) int {
	v := os.Getenv("AUTHORITY_FAILOVER_ROWS")
	if v == "" {
		return 10_000
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("AUTHORITY_FAILOVER_ROWS=%q: want a positive row count", v)
	}
	return n
}

// TestFailover: a node (its own process) holds N rows of 1 KiB mean payload
// and is killed; two other nodes (processes) keep placing rows throughout.
// Once etcd expired the dead node's lease, a replacement takes the next
// lease generation of its owner and moves every row onto it (RebindRows),
// then removes them all (RemoveAllByOwner). It prints
//
//	failover: rows=N rebind-s=… rebind-rows/s=… remove-s=… remove-rows/s=… other-writes=… other-writes-failed=0
//
// and requires that every row moved and then went, and that no write of
// the other nodes failed meanwhile.
func TestFailover(t *testing.T) {
	rows := failoverRows(t)
	c, cli := startCluster(t, etcdcluster.Options{MaxTxnOps: failoverMaxTxnOps})
	const ns = "/faults/failover/"
	st, err := etcdstore.New(settle(t), etcdstore.Config{Client: cli, Namespace: ns, RequestTimeout: failoverWriteTimeout,
		SkipVersionCheck: true, MaxTxnOps: failoverMaxTxnOps})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	const ttl = 2 * time.Second
	holder := startLineChild(t, envFailoverNode, failoverNodeConfig{Endpoints: c.Endpoints(), Namespace: ns, Role: "holder",
		RID: "holder", Rows: rows, TTL: ttl}, func(l failoverNodeLine) bool { return l.Event == "ready" })
	old := authority.OwnerToken{OwnerID: holder.ready.OwnerID, LeaseGeneration: holder.ready.Generation}
	waitFilled(t, holder)
	var writers []*lineChild[failoverNodeLine]
	for _, rid := range []string{"writer-1", "writer-2"} {
		writers = append(writers, startLineChild(t, envFailoverNode, failoverNodeConfig{Endpoints: c.Endpoints(), Namespace: ns,
			Role: "writer", RID: rid, TTL: ownerTTL}, func(l failoverNodeLine) bool { return l.Event == "ready" }))
	}
	requireIndexed(t, cli, ns, old, rows)
	expiry := watchLivenessDelete(t, cli, ns, old)
	start := time.Now()
	holder.signal(t, syscall.SIGKILL)
	<-expiry

	ctx := context.Background()
	node := authority.NodeDescriptor{MeshName: conformance.NodeA.MeshName, RID: "holder"}
	next, err := st.Registry().Acquire(ctx, node, conformance.NodeLifecycle, old.OwnerID, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = next.Close(context.Background()) })
	rebindStart := time.Now()
	moved, err := next.RebindRows(ctx, old)
	rebind := time.Since(rebindStart)
	if err != nil || moved != int64(rows) {
		t.Fatalf("rebind moved %d of %d rows: %v", moved, rows, err)
	}
	requireIndexed(t, cli, ns, old, 0)
	requireIndexed(t, cli, ns, next.Token(), rows)
	requireRowsOwnedBy(t, st, "holder-", next.Token(), rows)

	removeStart := time.Now()
	removed, err := st.RemoveAllByOwner(ctx, next.Token())
	remove := time.Since(removeStart)
	if err != nil || removed != int64(rows) {
		t.Fatalf("removed %d of %d rows: %v", removed, rows, err)
	}
	requireIndexed(t, cli, ns, next.Token(), 0)
	requireRowsOwnedBy(t, st, "holder-", next.Token(), 0)

	// the writers' counts from after the removal cover the whole failover
	end := time.Now()
	var writes, failed int64
	for _, w := range writers {
		w.waitFor(t, "its writes after the failover", func(ls []failoverNodeLine) bool {
			return len(ls) > 0 && ls[len(ls)-1].At > end.UnixNano()
		})
		ls := w.collected()
		first, last := writesAt(ls, start), ls[len(ls)-1]
		writes += last.OK - first.OK
		failed += last.Failed - first.Failed
		if last.Failed > first.Failed {
			t.Errorf("a writer's writes failed during the failover (last: %s)", last.Err)
		}
		w.stop(t)
	}
	t.Logf("failover: rows=%d rebind-s=%.2f rebind-rows/s=%.0f remove-s=%.2f remove-rows/s=%.0f other-writes=%d other-writes-failed=%d",
		rows, rebind.Seconds(), float64(rows)/rebind.Seconds(), remove.Seconds(), float64(rows)/remove.Seconds(), writes, failed)
	if writes == 0 {
		t.Error("the other nodes wrote nothing during the failover")
	}
}

// waitFilled waits until the holder reports its rows placed, as long as its
// fill keeps making progress (no settleTimeout without a row placed).
func waitFilled(t *testing.T, holder *lineChild[failoverNodeLine]) {
	t.Helper()
	var placed int64
	for {
		var filled, moved bool
		holder.waitFor(t, "its fill's progress", func(ls []failoverNodeLine) bool {
			for _, l := range ls {
				filled = filled || l.Event == "filled"
				if l.Event == "fill" && l.OK > placed {
					placed, moved = l.OK, true
				}
			}
			return filled || moved
		})
		if filled {
			return
		}
	}
}

// writesAt returns the last counts reported before at (the first line if
// none was).
func writesAt(ls []failoverNodeLine, at time.Time) failoverNodeLine {
	out := ls[0]
	for _, l := range ls {
		if l.At <= at.UnixNano() {
			out = l
		}
	}
	return out
}

// requireIndexed requires owner's index to hold n entries: its owner index
// entries and its placement keys on the holder's node (store version
// FewerKeys, where a row's placement key is its index entry).
func requireIndexed(t *testing.T, cli *clientv3.Client, ns string, owner authority.OwnerToken, n int) {
	t.Helper()
	holder := authority.NodeDescriptor{MeshName: conformance.NodeA.MeshName, RID: "holder"}
	var count int64
	for _, prefix := range []string{schema.OwnerIndexPrefix(ns, owner),
		schema.NewLayout(ns).PlacementOwnerPrefix(holder, conformance.NodeLifecycle, owner)} {
		resp, err := cli.Get(settle(t), prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		count += resp.Count
	}
	if count != int64(n) {
		t.Fatalf("owner %+v has %d index entries, want %d", owner, count, n)
	}
}

// requireRowsOwnedBy lists every row, page by page, and requires exactly n
// rows whose global ID starts with idPrefix, each owned by owner.
func requireRowsOwnedBy(t *testing.T, st *etcdstore.Store, idPrefix string, owner authority.OwnerToken, n int) {
	t.Helper()
	found := 0
	var cursor authority.ScanCursor
	for {
		var page authority.ScanResult
		eventually(t, "list", func(ctx context.Context) error {
			var err error
			page, err = st.ListAuthorities(ctx, "", cursor, authority.MaxScanLimit)
			return err
		})
		if page.Kind != authority.KindPage {
			t.Fatalf("list: %s", page.Kind)
		}
		for _, it := range page.Items {
			if !strings.Contains(string(it.Key), "/"+idPrefix) {
				continue
			}
			found++
			if it.Snapshot.Owner() != owner {
				t.Fatalf("row %s is owned by %+v, want %+v", it.Key, it.Snapshot.Owner(), owner)
			}
		}
		if cursor = page.NextCursor; cursor == "" {
			break
		}
	}
	if found != n {
		t.Fatalf("%d rows of %s*, want %d", found, idPrefix, n)
	}
}
