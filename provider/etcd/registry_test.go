package etcd_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// rewritingKV rewrites (same value, new ModRevision) the row key of every
// Txn that writes a row whose key contains only, just before sending it,
// while on, as a busy concurrent writer would: every compare of that row's
// version then fails. With del it deletes the row instead (as a concurrent
// removal would); with do, it calls do with the row key instead.
type rewritingKV struct {
	clientv3.KV
	on   *atomic.Bool
	only string
	del  bool
	do   func(ctx context.Context, key string)
}

func (k rewritingKV) Txn(ctx context.Context) clientv3.Txn {
	return &rewritingTxn{Txn: k.KV.Txn(ctx), ctx: ctx, k: k}
}

// rewritingTxn is a Txn of rewritingKV.
type rewritingTxn struct {
	clientv3.Txn
	ctx context.Context
	k   rewritingKV
}

func (t *rewritingTxn) If(cs ...clientv3.Cmp) clientv3.Txn {
	t.Txn = t.Txn.If(cs...)
	return t
}

func (t *rewritingTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	for _, op := range ops {
		key := string(op.KeyBytes())
		if t.k.on.Load() && op.IsPut() && strings.Contains(key, "/rows/") && strings.Contains(key, t.k.only) {
			if t.k.do != nil {
				t.k.do(t.ctx, key)
			} else if t.k.del {
				_, _ = shared.Delete(t.ctx, key)
			} else if resp, err := shared.Get(t.ctx, key); err == nil && len(resp.Kvs) == 1 {
				_, _ = shared.Put(t.ctx, key, string(resp.Kvs[0].Value))
			}
		}
	}
	t.Txn = t.Txn.Then(ops...)
	return t
}

func (t *rewritingTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.Txn = t.Txn.Else(ops...)
	return t
}

// A row that changes under every rebind attempt is reported, not skipped in
// silence; the other rows still move, and a second call moves the rest.
func TestRebindRowsReportsRowsLeftBehind(t *testing.T) {
	var on atomic.Bool
	c := server.Client(t)
	c.KV = rewritingKV{KV: c.KV, on: &on, only: "busy"}
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, c, etcdstore.Config{Clock: clock})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	ctx := context.Background()
	reg := s.Registry()
	first, err := reg.Acquire(ctx, conformance.NodeA, conformance.NodeLifecycle, "mover", 20*time.Second)
	require.NoError(t, err)
	defer first.Close(ctx)
	oldTgt := conformance.Target(conformance.NodeA, conformance.NodeLifecycle, first.Token())
	fx.Active(authority.ObjectActor, "busy", oldTgt)
	fx.Active(authority.ObjectActor, "quiet", oldTgt)
	second, err := reg.Acquire(ctx, conformance.NodeA, conformance.NodeLifecycle, "mover", 20*time.Second)
	require.NoError(t, err)
	defer second.Close(ctx)

	on.Store(true)
	moved, err := second.RebindRows(ctx, first.Token())
	on.Store(false)
	require.ErrorIs(t, err, authority.ErrUnavailable)
	require.Contains(t, err.Error(), "left 1 rows")
	require.Equal(t, int64(1), moved)
	require.Equal(t, first.Token(), fx.MustRow(fx.Key(authority.ObjectActor, "busy")).Owner())
	require.Equal(t, second.Token(), fx.MustRow(fx.Key(authority.ObjectActor, "quiet")).Owner())

	moved, err = second.RebindRows(ctx, first.Token())
	require.NoError(t, err)
	require.Equal(t, int64(1), moved)
	require.Equal(t, second.Token(), fx.MustRow(fx.Key(authority.ObjectActor, "busy")).Owner())
}

// Closing an owner lease that already expired succeeds: the lease is gone,
// which is what Close is for.
func TestOwnerLeaseCloseAfterExpiry(t *testing.T) {
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, nil, etcdstore.Config{Clock: clock})
	ctx := context.Background()
	l, err := s.Registry().Acquire(ctx, conformance.NodeA, conformance.NodeLifecycle, "short", 2*time.Second)
	require.NoError(t, err)
	// revoke it behind the lease's back, as its expiry would
	_, err = shared.Revoke(ctx, etcdstore.LeaseIDOf(l))
	require.NoError(t, err)
	select {
	case <-l.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the lease was not reported lost")
	}
	err = l.Close(ctx)
	require.NoError(t, err)
	require.False(t, errors.Is(err, authority.ErrUnavailable))
}

// A Close whose revoke failed can be called again, and the next call
// revokes: the owner is not left live until its TTL runs out.
func TestOwnerLeaseCloseRetriesTheRevoke(t *testing.T) {
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, nil, etcdstore.Config{Clock: clock})
	ctx := context.Background()
	l, err := s.Registry().Acquire(ctx, conformance.NodeA, conformance.NodeLifecycle, "closer", 20*time.Second)
	require.NoError(t, err)
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	require.Error(t, l.Close(cancelled))
	<-l.Done() // the keep-alive stopped all the same
	live, err := s.IsTargetLive(ctx, conformance.NodeA, conformance.NodeLifecycle, l.Token())
	require.NoError(t, err)
	require.True(t, live, "the failed revoke left the lease")

	require.NoError(t, l.Close(ctx))
	live, err = s.IsTargetLive(ctx, conformance.NodeA, conformance.NodeLifecycle, l.Token())
	require.NoError(t, err)
	require.False(t, live)
	require.NoError(t, l.Close(ctx), "closing a closed lease is fine")
}
