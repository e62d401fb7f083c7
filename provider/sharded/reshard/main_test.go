package reshard_test

import (
	"flag"
	"os"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	"github.com/zlink-systems/authority/internal/testkit/shardtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/sharded"
)

// clusterCount is how many embedded etcd clusters the tests grow a map
// over (on an external cluster: namespaces of it).
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

// clusters returns one fresh namespace on each cluster (deleted at t's
// cleanup): cluster i is the i-th shard a map grows to.
func clusters(t testing.TB) []etcdstore.Config {
	t.Helper()
	return shardtest.Namespaces(t, clients, clusterCount)
}

// openStore opens a sharded store over the first n of cs at epoch, with the
// others as spares, closed at t's cleanup.
func openStore(t testing.TB, cs []etcdstore.Config, n int, epoch int64, clock authority.Clock) *sharded.Store {
	t.Helper()
	return shardtest.Open(t, sharded.Config{Shards: cs[:n], Spares: cs[n:], Epoch: epoch, Clock: clock})
}

// harness is a conformance harness over s.
func harness(s *sharded.Store, clock *authority.ManualClock) *conformance.Harness {
	return shardtest.Harness(s, clock, 10*time.Minute)
}
