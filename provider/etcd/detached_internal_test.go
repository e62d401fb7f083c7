package etcd

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
)

// TestDetachedContextIsBounded: work that outlives its caller (a shared
// Grant, the revoke of a lease a failed request granted) ignores the
// caller's cancellation but still ends when the server cannot be reached,
// so a partition cannot leave MarkLive or Acquire hanging in their cleanup.
func TestDetachedContextIsBounded(t *testing.T) {
	srv := etcdtest.Start(t)
	client := srv.Client(t)
	// opened with the default timeouts (a loaded machine can take longer
	// than 500 ms for New's first requests), then bounded at 500 ms as a
	// store configured with DialTimeout 500 ms is
	s, err := New(context.Background(), Config{Client: client, Namespace: etcdtest.Namespace()})
	require.NoError(t, err)
	defer s.Close()
	require.Zero(t, s.timeout, "a store without a request timeout bounds detached work by its dial timeout")
	s.dialTimeout = 500 * time.Millisecond

	caller, cancel := context.WithCancel(context.Background())
	cancel()
	ctx, stop := s.detachedContext(caller)
	defer stop()
	require.NoError(t, ctx.Err(), "the caller's cancellation reaches detached work")
	deadline, ok := ctx.Deadline()
	require.True(t, ok, "detached work without a deadline")
	require.WithinDuration(t, time.Now().Add(500*time.Millisecond), deadline, 400*time.Millisecond)

	grant, err := client.Grant(context.Background(), 60)
	require.NoError(t, err)
	srv.Close() // every later request waits for a connection that never comes
	done := make(chan struct{})
	go func() {
		s.revokeDetached(context.Background(), grant.ID)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("a revoke against an unreachable server did not end")
	}
}
