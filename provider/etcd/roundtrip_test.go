package etcd_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// countingKV counts the KV round trips of a client.
type countingKV struct {
	clientv3.KV
	n *atomic.Int64
}

func (k countingKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	k.n.Add(1)
	return k.KV.Get(ctx, key, opts...)
}

func (k countingKV) Put(ctx context.Context, key, val string, opts ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	k.n.Add(1)
	return k.KV.Put(ctx, key, val, opts...)
}

func (k countingKV) Delete(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.DeleteResponse, error) {
	k.n.Add(1)
	return k.KV.Delete(ctx, key, opts...)
}

func (k countingKV) Do(ctx context.Context, op clientv3.Op) (clientv3.OpResponse, error) {
	k.n.Add(1)
	return k.KV.Do(ctx, op)
}

func (k countingKV) Txn(ctx context.Context) clientv3.Txn { return countingTxn{k.KV.Txn(ctx), k.n} }

type countingTxn struct {
	clientv3.Txn
	n *atomic.Int64
}

func (t countingTxn) If(cs ...clientv3.Cmp) clientv3.Txn { return countingTxn{t.Txn.If(cs...), t.n} }
func (t countingTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	return countingTxn{t.Txn.Then(ops...), t.n}
}
func (t countingTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	return countingTxn{t.Txn.Else(ops...), t.n}
}
func (t countingTxn) Commit() (*clientv3.TxnResponse, error) {
	t.n.Add(1)
	return t.Txn.Commit()
}

// countingLease counts lease grants.
type countingLease struct {
	clientv3.Lease
	n *atomic.Int64
}

func (l countingLease) Grant(ctx context.Context, ttl int64) (*clientv3.LeaseGrantResponse, error) {
	if ttl != etcdstore.AnnounceTTLSeconds { // the store's announcement is no request's lease
		l.n.Add(1)
	}
	return l.Lease.Grant(ctx, ttl)
}

func TestRoundTrips(t *testing.T) {
	var rpcs atomic.Int64
	c := server.Client(t)
	c.KV = countingKV{c.KV, &rpcs}
	c.Lease = countingLease{c.Lease, &rpcs}
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, c, etcdstore.Config{Clock: clock})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	ctx := context.Background()
	count := func(what string, want int64, op func()) {
		t.Helper()
		before := rpcs.Load()
		op()
		require.Equal(t, want, rpcs.Load()-before, "round trips of %s", what)
	}
	// warm up: the reservation terminals' lease bucket is granted once (an
	// abort writes a terminal; a commit, from storeversion.FewerKeys on,
	// none)
	fx.MustCommit(fx.Reserve(authority.ObjectUserSpot, "warm", conformance.TargetA), []byte("ready"))
	warm, err := s.Abort(ctx, fx.Reserve(authority.ObjectUserSpot, "warm-abort", conformance.TargetA).AbortRequest())
	require.NoError(t, err)
	require.Equal(t, authority.KindAborted, warm.Kind)

	var r conformance.Reservation
	count("reserve", 1, func() { r = fx.Reserve(authority.ObjectUserSpot, "spot", conformance.TargetA) })
	var ready *authority.Snapshot
	count("commit", 1, func() { ready = fx.MustCommit(r, []byte("ready")) })
	count("CAS put", 1, func() {
		res, err := s.CompareExchangeAuthority(ctx, r.Key, ready.StoreVersion, authority.Put([]byte("v2")))
		require.NoError(t, err)
		require.Equal(t, authority.KindStored, res.Kind)
	})
	var a conformance.Reservation
	count("reserve", 1, func() { a = fx.Reserve(authority.ObjectActor, "to-abort", conformance.TargetA) })
	count("abort", 1, func() {
		res, err := s.Abort(ctx, a.AbortRequest())
		require.NoError(t, err)
		require.Equal(t, authority.KindAborted, res.Kind)
	})
	s.SetCapacityPolicy(conformance.ActorLimit(10))
	count("reserve under a capacity policy", 2, func() { fx.Reserve(authority.ObjectActor, "limited", conformance.TargetA) })
	s.SetCapacityPolicy(conformance.ActorLimit(1)) // "limited" holds the only place
	count("reserve refused for capacity", 1, func() {
		res, err := s.Reserve(ctx, fx.ReserveRequest(authority.ObjectActor, "no-room", conformance.TargetA))
		require.NoError(t, err)
		require.Equal(t, authority.KindPlacementCapacityExhausted, res.Kind)
	})
	count("reserve of an existing row under a capacity policy", 1, func() {
		res, err := s.Reserve(ctx, fx.ReserveRequest(authority.ObjectActor, "limited", conformance.TargetA))
		require.NoError(t, err)
		require.Equal(t, authority.KindConflict, res.Kind)
	})
	s.SetCapacityPolicy(nil)
	// a CAS on a version this store has not seen reads first
	other := newStore(t, c, etcdstore.Config{Clock: clock, Namespace: s.Namespace(), SkipVersionCheck: true})
	row := fx.MustRow(r.Key)
	count("CAS put without the row cached", 2, func() {
		res, err := other.CompareExchangeAuthority(ctx, r.Key, row.StoreVersion, authority.Put([]byte("v3")))
		require.NoError(t, err)
		require.Equal(t, authority.KindStored, res.Kind)
	})
}

// TestConcurrentAbortsShareOneLeaseGrant: aborts that all need the
// reservation terminals' lease bucket of a fresh store wait for one Grant
// instead of each granting its own (the extras would sit unused until they
// expired). (Commits wrote such terminals too before
// storeversion.FewerKeys.)
func TestConcurrentAbortsShareOneLeaseGrant(t *testing.T) {
	var grants atomic.Int64
	c := server.Client(t)
	c.Lease = countingLease{c.Lease, &grants}
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, c, etcdstore.Config{Clock: clock})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	const n = 32
	rs := make([]conformance.Reservation, n)
	for i := range rs {
		rs[i] = fx.Reserve(authority.ObjectUserSpot, fmt.Sprintf("lease-%d", i), conformance.TargetA)
	}
	before := grants.Load()
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range rs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := s.Abort(context.Background(), rs[i].AbortRequest())
			if err == nil && res.Kind != authority.KindAborted {
				err = fmt.Errorf("abort %d: %s", i, res.Kind)
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	require.Equal(t, int64(1), grants.Load()-before, "lease grants for one bucket")
}
