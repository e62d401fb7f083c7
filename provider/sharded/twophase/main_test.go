package twophase_test

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
)

// shardCount is how many etcd clusters the tests run the protocol over.
const shardCount = 3

// servers are the package's etcd clusters, one per shard (embedded; on an
// external cluster, that cluster three times, each shard in its own
// namespace), and shared one client of each.
var (
	servers [shardCount]*etcdtest.Server
	shared  [shardCount]*clientv3.Client
)

func TestMain(m *testing.M) {
	flag.Parse()
	for i := range servers {
		var err error
		if servers[i], err = etcdtest.StartMain(); err == nil {
			shared[i], err = servers[i].NewClient()
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	code := m.Run()
	for i := range servers {
		_ = shared[i].Close()
		servers[i].Close()
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
