package etcd_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/zlink-systems/authority/conformance"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
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
