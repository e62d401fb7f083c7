package sharded_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/sharded"
)

// clusterCount is how many etcd clusters the package's tests shard over:
// embedded servers, each its own cluster (or, on an external cluster,
// three namespaces of it).
const clusterCount = 3

var (
	servers [clusterCount]*etcdtest.Server
	clients [clusterCount]*clientv3.Client
)

var testEpoch = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

func TestMain(m *testing.M) {
	flag.Parse()
	if err := start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		stop()
		os.Exit(1)
	}
	code := m.Run()
	stop()
	for _, s := range servers {
		if v := s.Violations(); len(v) > 0 {
			fmt.Fprintf(os.Stderr, "requests outside the test namespaces were refused: %q\n", v)
			code = 1
		}
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// start starts the clusters in parallel (each start-up takes about a
// second).
func start() error {
	errs := make([]error, clusterCount)
	var wg sync.WaitGroup
	for i := range clusterCount {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if servers[i], errs[i] = etcdtest.StartMain(); errs[i] == nil {
				clients[i], errs[i] = servers[i].NewClient()
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func stop() {
	for i := range clusterCount {
		if clients[i] != nil {
			_ = clients[i].Close()
		}
		if servers[i] != nil {
			servers[i].Close()
		}
	}
}

// shardConfigs returns n shard configurations, shard i on cluster i (mod
// the cluster count) in a fresh namespace of its own, whose keys are deleted
// at t's cleanup.
func shardConfigs(t testing.TB, n int) []etcdstore.Config {
	t.Helper()
	out := make([]etcdstore.Config, n)
	for i := range out {
		c, ns := clients[i%clusterCount], etcdtest.Namespace()
		out[i] = etcdstore.Config{Client: c, Namespace: ns}
		t.Cleanup(func() { _, _ = c.Delete(context.Background(), ns, clientv3.WithPrefix()) })
	}
	return out
}

// newStore opens a sharded store over cfg.Shards (n fresh shards when nil),
// closed at t's cleanup.
func newStore(t testing.TB, n int, cfg sharded.Config) *sharded.Store {
	t.Helper()
	if cfg.Shards == nil {
		cfg.Shards = shardConfigs(t, n)
	}
	s, err := sharded.New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("new sharded store: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// compactAll makes every revision read so far unreadable in every cluster.
func compactAll(t testing.TB) {
	t.Helper()
	etcdtest.SkipIfExternal(t, "compacting expires scans but would compact every key of the cluster")
	ctx := context.Background()
	for _, c := range clients {
		probe := etcdtest.Namespace() + "compaction-probe"
		if _, err := c.Put(ctx, probe, ""); err != nil {
			t.Fatal(err)
		}
		resp, err := c.Delete(ctx, probe)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
			t.Fatal(err)
		}
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// claimSet is a concurrency-safe authority.IdentityClaims.
type claimSet struct {
	mu   sync.Mutex
	keys map[authority.Key]bool
}

func (c *claimSet) IdentityClaimed(key authority.Key) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.keys[key]
}

func (c *claimSet) claim(key authority.Key) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.keys == nil {
		c.keys = map[authority.Key]bool{}
	}
	c.keys[key] = true
}
