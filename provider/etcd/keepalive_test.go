package etcd_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// unreachableLease fails every lease renewal while cut is set, as a network
// partition between the owner and etcd would.
type unreachableLease struct {
	clientv3.Lease
	cut *atomic.Bool
}

func (l unreachableLease) KeepAliveOnce(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseKeepAliveResponse, error) {
	if l.cut.Load() {
		<-ctx.Done() // the request hangs until its deadline
		return nil, ctx.Err()
	}
	return l.Lease.KeepAliveOnce(ctx, id)
}

// An owner cut off from etcd sees Done close before etcd expires its lease
// (its liveness key goes), never after: Deadline is measured from when each
// renewal was sent. While it can reach etcd, renewals move Deadline on.
func TestOwnerLeaseDoneBeforeEtcdExpiry(t *testing.T) {
	var cut atomic.Bool
	c := server.Client(t)
	c.Lease = unreachableLease{Lease: c.Lease, cut: &cut}
	ns := etcdtest.Namespace()
	s := newStore(t, c, etcdstore.Config{Namespace: ns})
	ctx := context.Background()
	const ttl = 2 * time.Second
	before := time.Now()
	l, err := s.Registry().Acquire(ctx, conformance.NodeA, conformance.NodeLifecycle, "cut-off", ttl)
	require.NoError(t, err)
	defer l.Close(ctx)
	first := l.Deadline()
	require.True(t, first.After(before) && !first.After(time.Now().Add(ttl)), "deadline %v", first)

	require.Eventually(t, func() bool { return l.Deadline().After(first) }, 5*time.Second, 20*time.Millisecond,
		"a renewal moves the deadline on")

	live, err := shared.Get(ctx, schema.OwnerLivenessPrefix(ns, l.Token()), clientv3.WithPrefix())
	require.NoError(t, err)
	require.Len(t, live.Kvs, 1)
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	gone := shared.Watch(wctx, string(live.Kvs[0].Key), clientv3.WithRev(live.Header.Revision+1))
	cut.Store(true)
	for wr := range gone {
		require.NoError(t, wr.Err())
		if len(wr.Events) > 0 && wr.Events[0].Type == clientv3.EventTypeDelete {
			select {
			case <-l.Done():
			default:
				t.Fatal("etcd expired the lease while its owner still held it")
			}
			require.False(t, time.Now().Before(l.Deadline()), "expired before the deadline")
			return
		}
	}
	t.Fatal("the liveness key never went")
}

// otherTerm answers every read as if from the next raft term: what a renewal
// made by a leader that had been paused, and is no longer one, sees when it
// is confirmed (the real leader answers the read, in its newer term).
type otherTerm struct{ clientv3.KV }

func (k otherTerm) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	resp, err := k.KV.Get(ctx, key, opts...)
	if err == nil && resp.Header != nil {
		resp.Header.RaftTerm++
	}
	return resp, err
}

// A renewal counts only once a linearizable read in its own raft term
// confirms it: with every confirming read answered in another term, no
// renewal moves Deadline on, and Done closes at the first deadline although
// etcd, which got every renewal, keeps the lease (CI saw a lease renewed by
// a resumed stale leader expire 615 ms before its Deadline).
func TestOwnerLeaseRenewalConfirmedInItsTerm(t *testing.T) {
	c := server.Client(t)
	c.KV = otherTerm{KV: c.KV}
	ns := etcdtest.Namespace()
	s := newStore(t, c, etcdstore.Config{Namespace: ns})
	ctx := context.Background()
	l, err := s.Registry().Acquire(ctx, conformance.NodeA, conformance.NodeLifecycle, "stale-term", 2*time.Second)
	require.NoError(t, err)
	defer l.Close(ctx)
	first := l.Deadline()
	select {
	case <-l.Done():
	case <-time.After(time.Until(first) + 5*time.Second):
		t.Fatal("Done did not close: an unconfirmed renewal moved the deadline on")
	}
	require.Equal(t, first, l.Deadline(), "the deadline moved")
	live, err := shared.Get(ctx, schema.OwnerLivenessPrefix(ns, l.Token()), clientv3.WithPrefix())
	require.NoError(t, err)
	require.Len(t, live.Kvs, 1, "etcd kept the lease (its renewals reached etcd)")
}
