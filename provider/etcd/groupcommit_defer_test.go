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

// failingKV fails the commit of every Txn for which fail, given the Txn's
// Then ops, returns an error (without sending it); other Txns are sent.
type failingKV struct {
	clientv3.KV
	fail func(then []clientv3.Op) error
}

func (k failingKV) Txn(ctx context.Context) clientv3.Txn {
	return &failingTxn{Txn: k.KV.Txn(ctx), fail: k.fail}
}

type failingTxn struct {
	clientv3.Txn
	fail func(then []clientv3.Op) error
	then []clientv3.Op
}

func (t *failingTxn) If(cs ...clientv3.Cmp) clientv3.Txn   { t.Txn = t.Txn.If(cs...); return t }
func (t *failingTxn) Else(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Else(ops...); return t }
func (t *failingTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.then = append(t.then, ops...)
	t.Txn = t.Txn.Then(ops...)
	return t
}
func (t *failingTxn) Commit() (*clientv3.TxnResponse, error) {
	if err := t.fail(t.then); err != nil {
		return nil, err
	}
	return t.Txn.Commit()
}

// failNextPut fails the next Txn that puts once *armed is set, as if its
// reply was lost (context.DeadlineExceeded), and disarms.
func failNextPut(armed *atomic.Bool) func(then []clientv3.Op) error {
	return func(then []clientv3.Op) error {
		for _, op := range then {
			if op.IsPut() {
				if armed.CompareAndSwap(true, false) {
					return context.DeadlineExceeded
				}
				return nil
			}
		}
		return nil
	}
}

// Requests deferred or found exhausted in a round whose Txn failed with an
// unknown outcome were not in that Txn: their error is ErrUnavailable and
// does not match ErrOutcomeUnknown; the admitted one's outcome is unknown.
func TestGroupCommitDeferredOnTxnErrorIsNotUnknown(t *testing.T) {
	var fail atomic.Bool
	c := server.Client(t)
	c.KV = failingKV{KV: c.KV, fail: failNextPut(&fail)}
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
