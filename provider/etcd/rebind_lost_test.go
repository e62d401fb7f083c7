package etcd_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
)

// RebindRows onto a lease that is already lost: every write would fail its
// liveness compare, so it stops at once with ErrLeaseLost instead of
// spending 16 attempts a row and reporting retryable contention.
func TestRebindRowsOntoLostLease(t *testing.T) {
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, nil, etcdstore.Config{Clock: clock})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	ctx := context.Background()
	reg := s.Registry()
	first, err := reg.Acquire(ctx, conformance.NodeA, conformance.NodeLifecycle, "mover", 20*time.Second)
	require.NoError(t, err)
	defer first.Close(ctx)
	oldTgt := conformance.Target(conformance.NodeA, conformance.NodeLifecycle, first.Token())
	for i := range 3 {
		fx.Active(authority.ObjectActor, fmt.Sprintf("r%d", i), oldTgt)
	}
	second, err := reg.Acquire(ctx, conformance.NodeA, conformance.NodeLifecycle, "mover", 20*time.Second)
	require.NoError(t, err)
	_, err = shared.Revoke(ctx, etcdstore.LeaseIDOf(second))
	require.NoError(t, err)
	select {
	case <-second.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("not reported lost")
	}
	start := time.Now()
	moved, err := second.RebindRows(ctx, first.Token())
	t.Logf("moved=%d err=%v in %v", moved, err, time.Since(start))
	require.ErrorIs(t, err, etcdstore.ErrLeaseLost)
	require.NotErrorIs(t, err, authority.ErrUnavailable, "a lost lease is not retryable contention")
	require.Zero(t, moved)
	require.Equal(t, first.Token(), fx.MustRow(fx.Key(authority.ObjectActor, "r0")).Owner())
}
