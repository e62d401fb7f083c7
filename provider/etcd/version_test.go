package etcd_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/preflight"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/proxy/grpcproxy"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// fakeMaintenance answers Status with a fixed server version, standing in for
// an old etcd server (none is needed to test the refusal).
type fakeMaintenance struct {
	pb.UnimplementedMaintenanceServer
	version string
}

func (f fakeMaintenance) Status(context.Context, *pb.StatusRequest) (*pb.StatusResponse, error) {
	return &pb.StatusResponse{Header: &pb.ResponseHeader{}, Version: f.version}, nil
}

// fakeServer serves fakeMaintenance on a loopback port until t ends.
func fakeServer(t *testing.T, version string) string {
	t.Helper()
	etcdtest.SkipIfExternal(t, externalFakeServer)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	pb.RegisterMaintenanceServer(srv, fakeMaintenance{version: version})
	// the store's own requests (its store version, announcements) go to the
	// real server, through etcd's gRPC proxy
	c := server.Client(t)
	ctx, cancel := context.WithCancel(context.Background())
	kv, kvDone := grpcproxy.NewKvProxy(c)
	lease, leaseDone := grpcproxy.NewLeaseProxy(ctx, c)
	watch, watchDone := grpcproxy.NewWatchProxy(ctx, zap.NewNop(), c)
	pb.RegisterKVServer(srv, kv)
	pb.RegisterLeaseServer(srv, lease)
	pb.RegisterWatchServer(srv, watch)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() {
		srv.Stop()
		<-done
		cancel()
		<-leaseDone
		<-watchDone
		_ = c.Close()
		<-kvDone
	})
	return lis.Addr().String()
}

func TestNewRefusesTooOldServer(t *testing.T) {
	for _, v := range []string{"3.3.27", "3.2.32", "2.3.8"} {
		t.Run(v, func(t *testing.T) {
			ep := fakeServer(t, v)
			s, err := etcdstore.New(context.Background(), etcdstore.Config{Endpoints: []string{ep}, RequestTimeout: 10 * time.Second})
			if err == nil {
				_ = s.Close()
				t.Fatalf("etcd %s accepted", v)
			}
			if !errors.Is(err, authority.ErrUnsupportedServer) {
				t.Fatalf("got %v, want ErrUnsupportedServer", err)
			}
			for _, want := range []string{v, ep, "minimum supported version " + preflight.MinServerVersion} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not name %q", err, want)
				}
			}
		})
	}
}

func TestNewAcceptsMinimumServer(t *testing.T) {
	for _, v := range []string{preflight.MinServerVersion, "3.4.23"} {
		ep := fakeServer(t, v)
		s, err := newOnFake(t, etcdstore.Config{Endpoints: []string{ep}, RequestTimeout: 10 * time.Second})
		if err != nil {
			t.Fatalf("etcd %s refused: %v", v, err)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	// the check can be skipped: an old server is then accepted
	ep := fakeServer(t, "3.3.27")
	s, err := newOnFake(t, etcdstore.Config{Endpoints: []string{ep}, SkipVersionCheck: true})
	if err != nil {
		t.Fatalf("SkipVersionCheck: %v", err)
	}
	_ = s.Close()
}

// newOnFake is New on a fakeServer, in a fresh namespace deleted at t's
// cleanup.
func newOnFake(t *testing.T, cfg etcdstore.Config) (*etcdstore.Store, error) {
	cfg.Namespace = etcdtest.Namespace()
	t.Cleanup(func() { _, _ = shared.Delete(context.Background(), cfg.Namespace, clientv3.WithPrefix()) })
	return etcdstore.New(context.Background(), cfg)
}

// TestStoreServerWarning: New accepts a server with known bugs and reports
// the warning; a fixed server has none.
func TestStoreServerWarning(t *testing.T) {
	for v, want := range map[string]string{"3.4.23": "fixed in " + preflight.RecommendedServer34, "3.5.36": ""} {
		ep := fakeServer(t, v)
		s, err := newOnFake(t, etcdstore.Config{Endpoints: []string{ep}, RequestTimeout: 10 * time.Second})
		if err != nil {
			t.Fatalf("etcd %s refused: %v", v, err)
		}
		got := s.ServerWarning()
		_ = s.Close()
		if want == "" && got != "" || want != "" && !strings.Contains(got, want) {
			t.Errorf("etcd %s: ServerWarning() = %q, want %q", v, got, want)
		}
	}
}
