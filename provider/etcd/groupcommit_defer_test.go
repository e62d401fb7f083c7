package etcd_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
)

type failTxnKV struct {
	clientv3.KV
	fail *atomic.Bool
}

func (k failTxnKV) Txn(ctx context.Context) clientv3.Txn {
	return &failTxn{Txn: k.KV.Txn(ctx), fail: k.fail}
}

type failTxn struct {
	clientv3.Txn
	fail *atomic.Bool
	puts bool
}

func (t *failTxn) If(cs ...clientv3.Cmp) clientv3.Txn   { t.Txn = t.Txn.If(cs...); return t }
func (t *failTxn) Else(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Else(ops...); return t }
func (t *failTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	for _, op := range ops {
		if op.IsPut() {
			t.puts = true
		}
	}
	t.Txn = t.Txn.Then(ops...)
	return t
}
func (t *failTxn) Commit() (*clientv3.TxnResponse, error) {
	if t.puts && t.fail.CompareAndSwap(true, false) {
		return nil, context.DeadlineExceeded // the reply was lost
	}
	return t.Txn.Commit()
}

// Requests deferred or found exhausted in a round whose Txn failed with an
// unknown outcome were not in that Txn: their error is ErrUnavailable and
// does not match ErrOutcomeUnknown; the admitted one's outcome is unknown.
func TestGroupCommitDeferredOnTxnErrorIsNotUnknown(t *testing.T) {
	var fail atomic.Bool
	c := server.Client(t)
	c.KV = failTxnKV{KV: c.KV, fail: &fail}
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, c, etcdstore.Config{Clock: clock})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	var calls atomic.Int64
	release, entered := make(chan struct{}), make(chan struct{})
	s.SetCapacityPolicy(conformance.CapacityPolicyFunc(func(_ authority.NodeDescriptor, _, _, _ authority.CapacityVector) bool {
		switch calls.Add(1) {
		case 1:
			close(entered)
			<-release
		case 2:
			fail.Store(true)
		case 3:
			return false // "full" is exhausted in the failing round
		}
		return true
	}))
	x := fx.ReserveRequest(authority.ObjectActor, "x", conformance.TargetA)
	a1 := fx.ReserveRequest(authority.ObjectActor, "dup", conformance.TargetA)
	a2 := fx.ReserveRequest(authority.ObjectActor, "dup", conformance.TargetA)
	var wg sync.WaitGroup
	full := fx.ReserveRequest(authority.ObjectActor, "full", conformance.TargetA)
	var err1, err2, err3 error
	wg.Go(func() { _, _ = s.Reserve(context.Background(), x) })
	<-entered
	wg.Go(func() { _, err1 = s.Reserve(context.Background(), a1) })
	waitQueued(t, s, 1)
	wg.Go(func() { _, err2 = s.Reserve(context.Background(), a2) })
	waitQueued(t, s, 2)
	wg.Go(func() { _, err3 = s.Reserve(context.Background(), full) })
	waitQueued(t, s, 3)
	close(release)
	wg.Wait()
	t.Logf("admitted: %v", err1)
	t.Logf("deferred: %v", err2)
	require.ErrorIs(t, err1, authority.ErrOutcomeUnknown)
	require.ErrorIs(t, err2, authority.ErrUnavailable)
	require.False(t, errors.Is(err2, authority.ErrOutcomeUnknown), "a request that was not in the Txn reports an unknown outcome")
	require.ErrorIs(t, err3, authority.ErrUnavailable)
	require.False(t, errors.Is(err3, authority.ErrOutcomeUnknown), "an exhausted request reports an unknown outcome")
}
