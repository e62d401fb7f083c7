package etcd_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
)

// server is the etcd every test of the package shares — embedded, or the
// external cluster of AUTHORITY_ETCD_ENDPOINTS (etcdtest.External); each
// test works in its own namespace.
var (
	server *etcdtest.Server
	shared *clientv3.Client
)

var testEpoch = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("test.fuzzworker"); f != nil && f.Value.String() == "true" {
		// A fuzz worker process runs only a fuzz target, and none of them
		// needs etcd: do not start one per worker (on a loaded machine the
		// start-up could outlast -fuzztime).
		os.Exit(m.Run())
	}
	var err error
	server, err = etcdtest.StartMain()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	shared, err = server.NewClient()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if etcdtest.External() {
		fmt.Fprintf(os.Stderr, "etcd provider tests against the external cluster %v, namespaces under %q\n",
			server.Endpoints(), etcdtest.Root())
	}
	code := m.Run()
	_ = shared.Close()
	server.Close()
	if v := server.Violations(); len(v) > 0 {
		fmt.Fprintf(os.Stderr, "requests outside the test namespaces were refused: %q\n", v)
		code = 1
	}
	if code == 0 {
		if err := goleak.Find(leakOptions()...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func leakOptions() []goleak.Option { return nil }

// Why tests skip on an external cluster.
const (
	externalLimits = "the test needs the server's default --max-txn-ops and --max-request-bytes, " +
		"an external cluster may run other values"
	externalForeignKeys = "the test writes keys outside its namespace and asserts no other test namespace exists"
	externalFakeServer  = "the fake old server passes the store's requests to the suite's server through etcd's gRPC proxy, " +
		"whose leader check watches a key outside the test prefix (the embedded server of every go test runs it)"
)

// newStore returns a store in a fresh namespace on client (shared when nil),
// closed and its namespace deleted at t's cleanup.
func newStore(t testing.TB, client *clientv3.Client, cfg etcdstore.Config) *etcdstore.Store {
	t.Helper()
	if client == nil {
		client = shared
	}
	cfg.Client = client
	if cfg.Namespace == "" {
		cfg.Namespace = etcdtest.Namespace()
	}
	s, err := etcdstore.New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("new store: %v", err)
	}
	t.Cleanup(func() {
		_ = s.Close()
		_, _ = shared.Delete(context.Background(), cfg.Namespace, clientv3.WithPrefix())
	})
	return s
}

// compactNow makes every revision read so far unreadable: it writes (and
// deletes) a probe key so the revision moves on, then compacts the shared
// server at the new revision.
// It skips t on an external cluster: compaction is cluster-wide.
func compactNow(t testing.TB) {
	t.Helper()
	etcdtest.Compact(t, shared)
}
