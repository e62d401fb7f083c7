package etcd_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Store.Close ends the keep-alive of every owner lease of the store, on a
// caller's client too (which Close leaves open): Done closes, so no
// goroutine keeps a closed store's owner live. The lease can still be
// revoked with OwnerLease.Close.
func TestStoreCloseEndsOwnerLeases(t *testing.T) {
	s := newStore(t, nil, etcdstore.Config{})
	ctx := context.Background()
	l, err := s.Registry().Acquire(ctx, conformance.NodeA, conformance.NodeLifecycle, "closing", time.Minute)
	require.NoError(t, err)
	require.NoError(t, s.Close())
	select {
	case <-l.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the owner lease was kept alive after Store.Close")
	}
	require.NoError(t, l.Close(ctx))
	ttl, err := shared.TimeToLive(ctx, etcdstore.LeaseIDOf(l))
	require.NoError(t, err)
	require.Equal(t, int64(-1), ttl.TTL, "the lease was not revoked")
}

// Close ends every WaitForChange with ErrClosed, on a caller's client (which
// Close leaves open) and on the store's own (which Close closes).
func TestCloseEndsWaitForChange(t *testing.T) {
	own := func(t *testing.T) *etcdstore.Store {
		s, err := etcdstore.New(context.Background(), etcdstore.Config{
			Endpoints: server.Endpoints(),
			CAFile:    os.Getenv(etcdtest.EnvCACert), CertFile: os.Getenv(etcdtest.EnvCert), KeyFile: os.Getenv(etcdtest.EnvKey),
			Username: os.Getenv(etcdtest.EnvUser), Password: os.Getenv(etcdtest.EnvPassword),
			Namespace: etcdtest.Namespace(),
		})
		require.NoError(t, err)
		t.Cleanup(func() {
			_ = s.Close()
			_, _ = shared.Delete(context.Background(), s.Namespace(), clientv3.WithPrefix())
		})
		return s
	}
	callers := func(t *testing.T) *etcdstore.Store { return newStore(t, nil, etcdstore.Config{}) }
	for name, open := range map[string]func(*testing.T) *etcdstore.Store{"caller's client": callers, "store's own client": own} {
		t.Run(name, func(t *testing.T) {
			s := open(t)
			// the caller's context outlives the test: only Close can end the wait
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			key, err := authority.EncodeKey(authority.ObjectActor, "never-written")
			require.NoError(t, err)
			waited := make(chan error, 1)
			go func() { waited <- s.WaitForChange(ctx, key, "") }()
			time.Sleep(200 * time.Millisecond) // let the wait reach its watch
			require.NoError(t, s.Close())
			select {
			case err := <-waited:
				require.ErrorIs(t, err, authority.ErrClosed)
			case <-time.After(20 * time.Second):
				t.Fatal("WaitForChange still blocked 20 s after Close")
			}
		})
	}
}

// Store.Close revokes the owner leases it still holds before it closes the
// client it dialled, so OwnerLease.Close after Store.Close keeps its promise:
// the liveness key is gone at once (not after the TTL) and Close answers
// without error. Before, Close failed on the closed client at every call
// and the key stayed until the TTL ran out.
func TestOwnerLeaseCloseAfterStoreCloseOnItsOwnClient(t *testing.T) {
	ns := etcdtest.Namespace()
	s, err := etcdstore.New(context.Background(), etcdstore.Config{
		Endpoints: server.Endpoints(),
		CAFile:    os.Getenv(etcdtest.EnvCACert), CertFile: os.Getenv(etcdtest.EnvCert), KeyFile: os.Getenv(etcdtest.EnvKey),
		Username: os.Getenv(etcdtest.EnvUser), Password: os.Getenv(etcdtest.EnvPassword),
		Namespace: ns,
	})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = s.Close()
		_, _ = shared.Delete(context.Background(), ns, clientv3.WithPrefix())
	})
	ctx := context.Background()
	l, err := s.Registry().Acquire(ctx, conformance.NodeA, conformance.NodeLifecycle, "closing-own", time.Minute)
	require.NoError(t, err)
	require.NoError(t, s.Close())
	select {
	case <-l.Done():
	default:
		t.Fatal("Store.Close returned before the lease's Done closed")
	}
	ttl, err := shared.TimeToLive(ctx, etcdstore.LeaseIDOf(l))
	require.NoError(t, err)
	require.Equal(t, int64(-1), ttl.TTL, "Store.Close did not revoke the owner lease")
	for range 2 { // each call keeps the promise
		require.NoError(t, l.Close(ctx))
	}
	_, err = s.Registry().Acquire(ctx, conformance.NodeA, conformance.NodeLifecycle, "after-close", time.Minute)
	require.ErrorIs(t, err, authority.ErrClosed)
}

// A caller that closes its client before the store: Store.Close has nothing
// it can send (the owner leases' revokes, the announcement's), so it returns
// at once instead of retrying on the closed connection until its 5 s revoke
// timeout (which also printed about 200 client retry lines). The test sets
// that timeout to 2 minutes, so the bound below (1 minute) tells the two
// apart on a machine however loaded. The leases
// expire at etcd by their TTL, as after a crash.
func TestCloseAfterTheCallersClientClosed(t *testing.T) {
	defer etcdstore.SetCloseRevokeTimeout(2 * time.Minute)()
	client := server.Client(t)
	s := newStore(t, client, etcdstore.Config{})
	ctx := context.Background()
	l, err := s.Registry().Acquire(ctx, conformance.NodeA, conformance.NodeLifecycle, "client-first", 2*time.Second)
	require.NoError(t, err)
	id := etcdstore.LeaseIDOf(l)
	require.NoError(t, client.Close())
	start := time.Now()
	require.NoError(t, s.Close())
	took := time.Since(start)
	// a Close that sends nothing takes milliseconds (measured here: under
	// 100 ms at load 20); one that retries waits out the 2-minute timeout
	require.Less(t, took, time.Minute, "Store.Close retried its revokes on a closed client")
	select {
	case <-l.Done():
	default:
		t.Fatal("the owner lease's Done is open after Store.Close")
	}
	// the lease was not revoked: it expires by its TTL
	require.Eventually(t, func() bool {
		ttl, err := shared.TimeToLive(ctx, id)
		return err == nil && ttl.TTL == -1
	}, time.Minute, 100*time.Millisecond)
}
