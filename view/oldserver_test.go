package view_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/proxy/grpcproxy"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/view"
)

// oldStatus answers Status with a fixed server version.
type oldStatus struct {
	pb.UnimplementedMaintenanceServer
	version string
}

func (o oldStatus) Status(context.Context, *pb.StatusRequest) (*pb.StatusResponse, error) {
	return &pb.StatusResponse{Header: &pb.ResponseHeader{}, Version: o.version}, nil
}

// oldServerHarness is an etcd store on a server that says it is etcd
// version (without reliable progress notifications below 3.4.31 / 3.5.13):
// a gRPC server answering Status with it and passing every KV, lease and
// watch request through etcd's gRPC proxy to an embedded server. It skips
// on an external cluster (the proxy's leader check watches a key outside
// the test prefix); CI runs the view's tests on Debian's etcd 3.4 itself.
func oldServerHarness(t *testing.T, version string) *conformance.Harness {
	t.Helper()
	etcdtest.SkipIfExternal(t, "the gRPC proxy of the old-server emulation watches a key outside the test prefix")
	srv := etcdtest.Start(t)
	backend := srv.Client(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := grpc.NewServer()
	pb.RegisterMaintenanceServer(g, oldStatus{version: version})
	ctx, cancel := context.WithCancel(context.Background())
	kv, kvDone := grpcproxy.NewKvProxy(backend)
	lease, leaseDone := grpcproxy.NewLeaseProxy(ctx, backend)
	watch, watchDone := grpcproxy.NewWatchProxy(ctx, zap.NewNop(), backend)
	pb.RegisterKVServer(g, kv)
	pb.RegisterLeaseServer(g, lease)
	pb.RegisterWatchServer(g, watch)
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(lis) }()
	client, err := clientv3.New(clientv3.Config{Endpoints: []string{lis.Addr().String()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	require.NoError(t, err)
	s, err := etcdstore.New(context.Background(), etcdstore.Config{Client: client, Namespace: etcdtest.Namespace()})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = s.Close()
		_ = client.Close()
		g.Stop()
		<-done
		cancel()
		<-leaseDone
		<-watchDone
		<-kvDone
	})
	return &conformance.Harness{
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
	}
}

// TestViewOldServerReadsStore starts views on servers without reliable
// progress notifications (Debian's 3.4.23, the last releases before the
// fixes): New succeeds, consistent reads and first pages come from the
// store (FromStore), bounded-stale reads too (the view is never known
// current), and every answer is the store's.
func TestViewOldServerReadsStore(t *testing.T) {
	for _, version := range []string{"3.4.23", "3.5.12"} {
		t.Run(version, func(t *testing.T) {
			h := oldServerHarness(t, version)
			for range 5 { // New once raced its own listing here
				v, err := view.New(t.Context(), h.Store.(view.Store), view.Config{})
				require.NoError(t, err)
				require.NoError(t, v.Close())
			}
			testViewReads(t, h, true)
			testViewConcurrentReads(t, h)
			fx := conformance.NewFixture(t, h)
			fx.Active(authority.ObjectUserSpot, "stale", conformance.TargetA)
			v := newView(t, h, view.Config{})
			r, err := v.Read(fx.Ctx(), fx.Key(authority.ObjectUserSpot, "stale"), view.Freshness{MaxStaleness: time.Hour})
			require.NoError(t, err)
			require.True(t, r.FromStore)
			require.Equal(t, authority.KindSnapshot, r.Kind)
		})
	}
}
