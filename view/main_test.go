package view_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/memory"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// memoryHarness is a fresh memory store (on the wall clock) with its
// controls; cfg's Liveness is set here.
func memoryHarness(t testing.TB, cfg memory.Config) (*memory.Store, *conformance.Harness) {
	live := memory.NewLiveSet()
	cfg.Liveness = live
	s := memory.New(cfg)
	return s, &conformance.Harness{
		Store: s,
		SetLive: func(_ testing.TB, node authority.NodeDescriptor, gen int64, owner authority.OwnerToken, isLive bool) {
			live.Set(node, gen, owner, isLive)
		},
		Now:         time.Now,
		ExpireScans: func(testing.TB) { s.ExpireScans() },
	}
}

// etcdHarness is a fresh etcd store on an embedded server of its own (fsync
// as asked) with its controls.
func etcdHarness(t testing.TB, fsync bool) (*etcdstore.Store, *conformance.Harness, *clientv3.Client) {
	var opts []etcdtest.Option
	if fsync {
		opts = append(opts, etcdtest.WithFsync(true))
	}
	srv := etcdtest.Start(t, opts...) // without options: also on CI's external servers
	client := srv.Client(t)
	s, err := etcdstore.New(context.Background(), etcdstore.Config{Client: client, Namespace: etcdtest.Namespace()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s, &conformance.Harness{
		Store: s,
		SetLive: func(t testing.TB, node authority.NodeDescriptor, gen int64, owner authority.OwnerToken, isLive bool) {
			var err error
			if isLive {
				err = s.MarkLive(context.Background(), node, gen, owner, 10*time.Minute)
			} else {
				err = s.MarkDead(context.Background(), node, gen, owner)
			}
			require.NoError(t, err)
		},
		Now: time.Now,
	}, client
}
