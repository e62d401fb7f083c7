package etcd_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/internal/etcdtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
)

// server is the embedded etcd every test of the package shares; each test
// works in its own namespace.
var (
	server *etcdtest.Server
	shared *clientv3.Client
)

var testEpoch = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

func TestMain(m *testing.M) {
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
	code := m.Run()
	_ = shared.Close()
	server.Close()
	if code == 0 {
		if err := goleak.Find(leakOptions()...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func leakOptions() []goleak.Option { return nil }

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
func compactNow(t testing.TB) {
	t.Helper()
	ctx := context.Background()
	probe := etcdtest.Namespace() + "compaction-probe"
	if _, err := shared.Put(ctx, probe, ""); err != nil {
		t.Fatal(err)
	}
	resp, err := shared.Delete(ctx, probe)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := shared.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
}
