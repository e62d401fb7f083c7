package etcd_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// slowReadKV moves the store's clock on by jump during the first Txn it
// sends once armed, as a slow read would: the decision that follows is made
// at the later time.
type slowReadKV struct {
	clientv3.KV
	armed *atomic.Bool
	clock *authority.ManualClock
	jump  time.Duration
}

func (k slowReadKV) Txn(ctx context.Context) clientv3.Txn {
	return slowReadTxn{Txn: k.KV.Txn(ctx), kv: k}
}

type slowReadTxn struct {
	clientv3.Txn
	kv slowReadKV
}

func (t slowReadTxn) If(cs ...clientv3.Cmp) clientv3.Txn {
	return slowReadTxn{Txn: t.Txn.If(cs...), kv: t.kv}
}
func (t slowReadTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	return slowReadTxn{Txn: t.Txn.Then(ops...), kv: t.kv}
}
func (t slowReadTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	return slowReadTxn{Txn: t.Txn.Else(ops...), kv: t.kv}
}
func (t slowReadTxn) Commit() (*clientv3.TxnResponse, error) {
	resp, err := t.Txn.Commit()
	if t.kv.armed.CompareAndSwap(true, false) {
		t.kv.clock.Advance(t.kv.jump)
	}
	return resp, err
}

// A completion whose terminal expires while the store reads is refused at
// write time: it never makes the row active with a terminal nobody can read.
func TestCompleteCreationRechecksTerminalExpiryAtWriteTime(t *testing.T) {
	var armed atomic.Bool
	clock := authority.NewManualClock(testEpoch)
	c := server.Client(t)
	c.KV = slowReadKV{KV: c.KV, armed: &armed, clock: clock, jump: 10 * time.Minute}
	s := newStore(t, c, etcdstore.Config{Clock: clock})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	r := fx.Reserve(authority.ObjectActor, "late", conformance.TargetA)
	pub := fx.PublicationFor(fx.Operation(), time.Minute) // expires at +6 min
	before := fx.State()
	etcdstore.ForgetRows(s) // the completion must read the row
	armed.Store(true)
	res, err := s.CompleteCreation(context.Background(), r.CompleteRequest(authority.TerminalCreated, []byte("ready"), pub))
	require.ErrorIs(t, err, authority.ErrInvalidArgument, "completion answered %+v", res)
	fx.RequireState(before)
	read, err := s.ReadCreationTerminal(context.Background(), pub.Operation)
	require.NoError(t, err)
	require.Equal(t, authority.KindMissing, read.Kind)
}

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

// A read that finds a creation terminal expired deletes it (fenced on its
// ModRevision), so another store whose clock is behind — as a stepped-back
// clock is — does not see it alive either: expiry seen once holds for every
// store. Before, the read only hid the terminal.
func TestExpiredTerminalReadIsGoneForEveryStore(t *testing.T) {
	ns := etcdtest.Namespace()
	ahead, behind := authority.NewManualClock(testEpoch), authority.NewManualClock(testEpoch)
	s1 := newStore(t, nil, etcdstore.Config{Clock: ahead, Namespace: ns})
	s2 := newStore(t, nil, etcdstore.Config{Clock: behind, Namespace: ns})
	fx := conformance.NewFixture(t, harnessFor(s1, ahead))
	r := fx.Reserve(authority.ObjectActor, "seen-expired", conformance.TargetA)
	pub := fx.PublicationFor(fx.Operation(), time.Minute)
	fx.MustComplete(r, authority.TerminalCreated, []byte("ready"), pub)
	ctx := context.Background()
	read, err := s2.ReadCreationTerminal(ctx, pub.Operation)
	require.NoError(t, err)
	require.Equal(t, authority.KindFound, read.Kind, "live at both clocks")

	ahead.Advance(time.Hour)
	read, err = s1.ReadCreationTerminal(ctx, pub.Operation)
	require.NoError(t, err)
	require.Equal(t, authority.KindMissing, read.Kind)
	read, err = s2.ReadCreationTerminal(ctx, pub.Operation)
	require.NoError(t, err)
	require.Equal(t, authority.KindMissing, read.Kind, "s1 saw it expired: s2, whose clock is behind, must not see it alive")
	got, err := shared.Get(ctx, ns, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	require.NoError(t, err)
	for _, kv := range got.Kvs {
		require.NotContains(t, string(kv.Key), "/terminals/", "the expired terminal was deleted")
	}
}
