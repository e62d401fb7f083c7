package reshard_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/sharded"
)

// clusterCount is how many embedded etcd clusters the tests grow a map
// over (on an external cluster: namespaces of it).
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
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

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

// clusters returns one fresh namespace on each cluster (deleted at t's
// cleanup): cluster i is the i-th shard a map grows to.
func clusters(t testing.TB) []etcdstore.Config {
	t.Helper()
	out := make([]etcdstore.Config, clusterCount)
	for i := range out {
		c, ns := clients[i], etcdtest.Namespace()
		out[i] = etcdstore.Config{Client: c, Namespace: ns}
		t.Cleanup(func() { _, _ = c.Delete(context.Background(), ns, clientv3.WithPrefix()) })
	}
	return out
}

// openStore opens a sharded store over the first n of cs at epoch, with the
// others as spares, closed at t's cleanup.
func openStore(t testing.TB, cs []etcdstore.Config, n int, epoch int64, clock authority.Clock) *sharded.Store {
	t.Helper()
	s, err := sharded.New(context.Background(), sharded.Config{Shards: cs[:n], Spares: cs[n:], Epoch: epoch, Clock: clock})
	if err != nil {
		t.Fatalf("new sharded store: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// harness is a conformance harness over s.
func harness(s *sharded.Store, clock *authority.ManualClock) *conformance.Harness {
	h := &conformance.Harness{
		Store: s,
		SetLive: func(t testing.TB, node authority.NodeDescriptor, lifecycle int64, owner authority.OwnerToken, live bool) {
			t.Helper()
			var err error
			if live {
				err = s.MarkLive(context.Background(), node, lifecycle, owner, 10*time.Minute)
			} else {
				err = s.MarkDead(context.Background(), node, lifecycle, owner)
			}
			if err != nil {
				t.Fatalf("set live: %v", err)
			}
		},
		Now:             time.Now,
		Relocation:      s.Relocation(),
		RecordRetention: s.RecordRetention(),
	}
	if clock != nil {
		h.AdvanceClock = func(_ testing.TB, d time.Duration) { clock.Advance(d) }
		h.Now = clock.Now
	}
	return h
}
