package faults_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The single-member fault tests (restore, quota, compaction, paused owner)
// run one embedded etcd member (internal/embedded) at a fixed address and
// open stores on it that dial their own client, as a process would.

// embeddedStore opens a store on the member at addr in namespace ns, with a
// fixture whose SetLive marks owners live for an hour; closed at t's cleanup.
func embeddedStore(t *testing.T, addr, ns string) (*etcdstore.Store, *conformance.Fixture) {
	t.Helper()
	s, err := etcdstore.New(context.Background(), etcdstore.Config{Endpoints: []string{addr}, Namespace: ns, RequestTimeout: 5 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	clock := authority.SystemClock{}
	h := &conformance.Harness{
		Store: s, Now: clock.Now,
		SetLive: func(t testing.TB, node authority.NodeDescriptor, lifecycle int64, owner authority.OwnerToken, live bool) {
			require.NoError(t, s.MarkLive(context.Background(), node, lifecycle, owner, time.Hour))
		},
	}
	return s, conformance.NewFixture(t, h)
}

// compactDefrag compacts the member at endpoint to its current revision and
// defragments it (the operator's procedure after a quota alarm).
func compactDefrag(ctx context.Context, t *testing.T, raw *clientv3.Client, endpoint string) {
	t.Helper()
	status, err := raw.Status(ctx, endpoint)
	require.NoError(t, err)
	_, err = raw.Compact(ctx, status.Header.Revision)
	require.NoError(t, err)
	_, err = raw.Defragment(ctx, endpoint)
	require.NoError(t, err)
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}
