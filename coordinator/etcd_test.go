package coordinator_test

import (
	"context"
	"testing"
	"time"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestScenariosEtcd runs every coordinator scenario on the etcd provider,
// against one embedded etcd server (or the external cluster of
// AUTHORITY_ETCD_ENDPOINTS, see etcdtest), each scenario in its own namespace.
func TestScenariosEtcd(t *testing.T) {
	if testing.Short() {
		t.Skip("embedded etcd: skipped with -short")
	}
	server := etcdtest.Start(t)
	client := server.Client(t)
	runScenarios(t, func(t *testing.T) *Harness { return etcdHarness(t, client) })
}

// TestScenariosEtcdView runs every coordinator scenario on the etcd
// provider with row reads from a local read view (withView): from memory on
// a server with reliable progress notifications, from etcd on an older one
// (CI runs it on each standalone server of .ci/etcd-versions).
func TestScenariosEtcdView(t *testing.T) {
	if testing.Short() {
		t.Skip("embedded etcd: skipped with -short")
	}
	server := etcdtest.Start(t)
	client := server.Client(t)
	runScenarios(t, withView(func(t *testing.T) *Harness { return etcdHarness(t, client) }))
}

func etcdHarness(t *testing.T, client *clientv3.Client) *Harness {
	ns := etcdtest.Namespace()
	s, err := etcdstore.New(context.Background(), etcdstore.Config{Client: client, Namespace: ns})
	if err != nil {
		t.Fatalf("etcd store: %v", err)
	}
	t.Cleanup(func() {
		_ = s.Close()
		_, _ = client.Delete(context.Background(), ns, clientv3.WithPrefix())
	})
	return &Harness{
		Store: s,
		SetLive: func(t testing.TB, node authority.NodeDescriptor, gen int64, owner authority.OwnerToken, live bool) {
			t.Helper()
			var err error
			if live {
				err = s.MarkLive(context.Background(), node, gen, owner, 10*time.Minute)
			} else {
				err = s.MarkDead(context.Background(), node, gen, owner)
			}
			if err != nil {
				t.Fatalf("set live: %v", err)
			}
		},
		SetCapacityPolicy: func(_ testing.TB, p authority.CapacityPolicy) { s.SetCapacityPolicy(p) },
		Now:               time.Now,
		Relocation:        s.Relocation(),
	}
}
