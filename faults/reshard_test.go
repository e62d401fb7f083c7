package faults_test

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/internal/testkit/etcdcluster"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/sharded"
	"github.com/zlink-systems/authority/provider/sharded/reshard"
)

// reshardFill is how many rows each node creates before the map grows:
// AUTHORITY_RESHARD_FILL, else 1000.
func reshardFill(t *testing.T) int {
	v := os.Getenv("AUTHORITY_RESHARD_FILL")
	if v == "" {
		return 1000
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("AUTHORITY_RESHARD_FILL=%q: want a positive row count", v)
	}
	return n
}

// reshardNodes is how many node processes write.
const reshardNodes = 2

// TestReshardUnderWriters: three etcd clusters (real processes); two nodes
// (processes), each with a sharded store on the first cluster, create and
// rewrite rows throughout, each write read back at once through a second
// store of the node. The map grows from one cluster to two, the mover (a
// process) killed mid-copy and the job resumed by another process after
// the dead one's claim expired, then from two to three, the mover killed
// mid-switch (the new cluster switched, the sources frozen) and resumed.
// Then every acknowledged write reads back from a store on the new map,
// every row is in exactly one shard, every key decodes. It prints
//
//	reshard: from=1 to=3 rows=… moved=… acked=… lost=0 stale=0 duplicate=0 corrupt=0 resumed-after-kill=2 max-refused-ms=…
func TestReshardUnderWriters(t *testing.T) {
	var clusters []reshardCluster
	var clients []*clientv3.Client
	for range 3 {
		c, cli := startCluster(t, etcdcluster.Options{Members: 1})
		clusters = append(clusters, reshardCluster{Endpoints: c.Endpoints(), Namespace: "/faults/reshard/"})
		clients = append(clients, cli)
	}
	acked := map[string]string{}    // key → the payload last acknowledged
	inFlight := map[string]string{} // key → a payload sent after it
	var maxRefused, refused int64
	stale := 0
	var nodes []*lineChild[reshardNodeLine]
	for i := range reshardNodes {
		nodes = append(nodes, startLineChild(t, envReshardNode, reshardNodeConfig{Node: i, Clusters: clusters, Shards: 1, Fill: reshardFill(t)},
			func(l reshardNodeLine) bool { return l.Event == "ready" }))
	}
	resumed := 0
	for n, kill := range []struct {
		at    string
		count int
	}{{"copying shard 0 after", 3}, {"switching shard 0", 1}} {
		mover := startLineChild(t, envReshardMover, reshardMoverConfig{Shards: clusters[:n+1], Add: clusters[n+1],
			BlockAt: kill.at, BlockCount: kill.count, ClaimTTL: 3 * time.Second},
			func(l reshardMoverLine) bool { return l.Blocked })
		mover.signal(t, syscall.SIGKILL)
		<-mover.exited
		start := time.Now()
		p, err := reshard.Run(settle(t), reshard.Config{Shards: configs(clusters[:n+1]), Add: clusters[n+1].config(), Mover: "faults-resumer",
			LeaseWait: 20 * time.Second, AggregateWait: time.Second})
		if err != nil {
			t.Fatalf("resuming the job killed at %q: %v (%v)", kill.at, err, p)
		}
		if p.Phase != schema.PhaseDone {
			t.Fatalf("the resumed job ended at phase %s", p.Phase)
		}
		resumed++
		t.Logf("grow %d→%d resumed after the kill at %q in %s: %s", n+1, n+2, mover.ready.Step, time.Since(start).Round(time.Millisecond), p)
	}
	time.Sleep(time.Second) // writes under the final map
	for _, node := range nodes {
		node.stop(t)
		for _, l := range node.collected() {
			switch l.Event {
			case "trying":
				inFlight[l.Key] = l.Payload
			case "acked":
				acked[l.Key] = l.Payload
				delete(inFlight, l.Key)
				maxRefused, refused = max(maxRefused, l.RefusedMs), max(refused, l.Refused)
			case "stale":
				stale++
			case "failed":
				t.Errorf("a node failed: %s", l.Err)
			}
		}
	}
	lost, duplicate, corrupt, moved, rows := verifyResharded(t, clients, clusters, acked, inFlight)
	t.Logf("reshard: from=1 to=3 rows=%d moved=%d acked=%d lost=%d stale=%d duplicate=%d corrupt=%d resumed-after-kill=%d max-refused-ms=%d (writes refused and retried: %d)",
		rows, moved, len(acked), lost, stale, duplicate, corrupt, resumed, maxRefused, refused)
	if lost+stale+duplicate+corrupt > 0 {
		t.Errorf("lost=%d stale=%d duplicate=%d corrupt=%d", lost, stale, duplicate, corrupt)
	}
	if refused == 0 {
		t.Log("no write met a frozen row (the switches were shorter than the writes' spacing)")
	}
}

// verifyResharded reads every acknowledged row through a store on the map
// of the three clusters (a row whose last write was in flight may hold that
// write instead), and checks every key of every namespace: each decodes, and
// each row's keys are in the one shard the map places them in. moved counts
// the rows outside the first cluster.
func verifyResharded(t *testing.T, clients []*clientv3.Client, clusters []reshardCluster, acked, inFlight map[string]string) (lost, duplicate, corrupt, moved, rows int) {
	t.Helper()
	ctx := settle(t)
	s, err := sharded.New(ctx, sharded.Config{Shards: configs(clusters), Epoch: int64(len(clusters))})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	for key, payload := range acked {
		read, err := s.ReadAuthority(ctx, authority.Key(key))
		if err != nil {
			t.Fatal(err)
		}
		if read.Kind != authority.KindSnapshot || string(read.Snapshot.Payload) != payload && string(read.Snapshot.Payload) != inFlight[key] {
			lost++
			t.Errorf("row %s: %v, acknowledged %q", key, read.Kind, payload)
		}
	}
	where := map[authority.Key]int{}
	for i, cli := range clients {
		ns := clusters[i].Namespace
		resp, err := cli.Get(ctx, ns, clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		l := schema.NewLayout(ns)
		for _, kv := range resp.Kvs {
			if _, err := schema.DecodeEntry(ns, kv); err != nil {
				corrupt++
				t.Errorf("shard %d: %v", i, err)
			}
			kind, row, _ := l.MoveKindOf(string(kv.Key))
			if kind != schema.MoveWithRow {
				continue
			}
			if sharded.Place(row, len(clusters)) != i {
				duplicate++
				t.Errorf("key %s of row %s is in shard %d", kv.Key, row, i)
			}
			if strings.HasPrefix(string(kv.Key), l.RowsPrefix()) {
				if _, dup := where[row]; dup {
					duplicate++
				}
				where[row] = i
				if i > 0 {
					moved++
				}
			}
		}
	}
	return lost, duplicate, corrupt, moved, len(where)
}
