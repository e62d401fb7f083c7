package etcd_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// slowGrantLease runs onGrant after the first Grant once armed, as a slow
// lease grant would.
type slowGrantLease struct {
	clientv3.Lease
	armed   *atomic.Bool
	onGrant func()
}

func (l slowGrantLease) Grant(ctx context.Context, ttl int64) (*clientv3.LeaseGrantResponse, error) {
	resp, err := l.Lease.Grant(ctx, ttl)
	if l.armed.CompareAndSwap(true, false) {
		l.onGrant()
	}
	return resp, err
}

// When the reserved row is cached (no read) and the terminal expires while
// its record leases are granted, the completion is refused as the Txn is
// built: nothing is written and the row stays reserved.
func TestCompleteCreationRechecksTerminalExpiryAfterLeaseGrant(t *testing.T) {
	clock := authority.NewManualClock(testEpoch)
	var armed atomic.Bool
	c := server.Client(t)
	// the terminal lives until deadline (1 min) + 5 min; the grant takes 7
	c.Lease = slowGrantLease{Lease: c.Lease, armed: &armed, onGrant: func() { clock.Advance(7 * time.Minute) }}
	s := newStore(t, c, etcdstore.Config{Clock: clock})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	ctx := context.Background()
	r := fx.Reserve(authority.ObjectActor, "late", conformance.TargetA)
	pub := fx.PublicationFor(fx.Operation(), time.Minute)
	rev, n := namespaceRevision(t, s.Namespace())

	armed.Store(true)
	res, err := s.CompleteCreation(ctx, r.CompleteRequest(authority.TerminalCreated, []byte("ready"), pub))
	require.False(t, armed.Load(), "the completion granted no lease")
	require.ErrorIs(t, err, authority.ErrInvalidArgument, "published %+v", res)
	rev2, n2 := namespaceRevision(t, s.Namespace())
	require.Equal(t, [2]int64{rev, int64(n)}, [2]int64{rev2, int64(n2)}, "the refused completion wrote")
	require.Equal(t, authority.AllocationReserved, fx.MustRow(r.Key).Allocation.State)

	// a fresh publication completes the same reservation
	fx.MustComplete(r, authority.TerminalCreated, []byte("ready"), fx.PublicationFor(fx.Operation(), time.Minute))
}
