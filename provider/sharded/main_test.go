package sharded_test

import (
	"flag"
	"os"
	"strconv"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	"github.com/zlink-systems/authority/internal/testkit/shardtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/sharded"
)

// clusterCount is how many etcd clusters the package's tests shard over:
// embedded servers, each its own cluster (or, on an external cluster,
// three namespaces of it).
const clusterCount = 3

var (
	servers []*etcdtest.Server
	clients []*clientv3.Client
)

var testEpoch = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(shardtest.Main(m, clusterCount, func(c *shardtest.Clusters) { servers, clients = c.Servers, c.Clients }, goleak.Find))
}

// shardConfigs returns n shard configurations, shard i on cluster i (mod
// the cluster count) in a fresh namespace of its own, whose keys are deleted
// at t's cleanup.
func shardConfigs(t testing.TB, n int) []etcdstore.Config {
	t.Helper()
	return shardtest.Namespaces(t, clients, n)
}

// newStore opens a sharded store over cfg.Shards (n fresh shards when nil),
// closed at t's cleanup.
func newStore(t testing.TB, n int, cfg sharded.Config) *sharded.Store {
	t.Helper()
	if cfg.Shards == nil {
		cfg.Shards = shardConfigs(t, n)
	}
	return shardtest.Open(t, cfg)
}

// compactAll makes every revision read so far unreadable in every cluster.
func compactAll(t testing.TB) {
	t.Helper()
	etcdtest.Compact(t, clients...)
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
