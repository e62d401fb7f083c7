package etcd_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// gate wraps a client's KV: it counts Txn commits, records how many ops the
// last multi-op Txn carried, can hold commits until released, and can fail
// the next Txn of more than one op without sending it.
type gate struct {
	txns     atomic.Int64
	mu       sync.Mutex
	held     chan struct{} // non-nil: commits wait for it to close
	fail     error
	failLate error // returned after the Txn applied
	lastOps  int
	lastCmps int
}

func (g *gate) hold() (release func()) {
	ch := make(chan struct{})
	g.mu.Lock()
	g.held = ch
	g.mu.Unlock()
	return func() {
		g.mu.Lock()
		g.held = nil
		g.mu.Unlock()
		close(ch)
	}
}

type gateKV struct {
	clientv3.KV
	g *gate
}

func (k gateKV) Txn(ctx context.Context) clientv3.Txn { return &gateTxn{Txn: k.KV.Txn(ctx), g: k.g} }

type gateTxn struct {
	clientv3.Txn
	g          *gate
	then, cmps int
}

func (t *gateTxn) If(cs ...clientv3.Cmp) clientv3.Txn {
	t.Txn, t.cmps = t.Txn.If(cs...), len(cs)
	return t
}
func (t *gateTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.Txn = t.Txn.Else(ops...)
	return t
}
func (t *gateTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.Txn, t.then = t.Txn.Then(ops...), len(ops)
	return t
}

func (t *gateTxn) Commit() (*clientv3.TxnResponse, error) {
	t.g.txns.Add(1)
	t.g.mu.Lock()
	held := t.g.held
	t.g.mu.Unlock()
	if held != nil {
		<-held
	}
	t.g.mu.Lock()
	var fail, late error
	if t.then > 1 {
		t.g.lastOps, t.g.lastCmps = t.then, t.cmps
		fail, t.g.fail = t.g.fail, nil
		late, t.g.failLate = t.g.failLate, nil
	}
	t.g.mu.Unlock()
	if fail != nil {
		return nil, fail
	}
	resp, err := t.Txn.Commit()
	if late != nil {
		return nil, late
	}
	return resp, err
}

// batchFixture is a store with one Txn slot behind a gate, and n active
// Spots on it.
type batchFixture struct {
	g     *gate
	s     *etcdstore.Store
	fx    *conformance.Fixture
	rows  []*authority.Snapshot
	keys  []authority.Key
	clock *authority.ManualClock
}

func newBatchFixture(t *testing.T, n int) *batchFixture {
	g := &gate{}
	c := server.Client(t)
	c.KV = gateKV{c.KV, g}
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, c, etcdstore.Config{Clock: clock, MaxConcurrentTxns: 1})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	b := &batchFixture{g: g, s: s, fx: fx, clock: clock}
	for i := range n {
		r := fx.Reserve(authority.ObjectUserSpot, fmt.Sprintf("b%d", i), conformance.TargetA)
		b.rows, b.keys = append(b.rows, fx.MustCommit(r, []byte("ready"))), append(b.keys, r.Key)
	}
	return b
}

type casOutcome struct {
	res authority.CompareExchangeResult
	err error
}

// queue holds the store's only slot with a CAS put on row 0, queues one CAS
// put per entry of expected (row i+1 at expected[i]) behind it, and returns
// a function that releases the slot and returns every outcome (row 0 first).
func (b *batchFixture) queue(t *testing.T, ctxs []context.Context, keys []authority.Key, expected []authority.StoreVersion) func() []casOutcome {
	t.Helper()
	release := b.g.hold()
	before := b.g.txns.Load()
	outs := make([]casOutcome, len(keys)+1)
	var wg sync.WaitGroup
	cas := func(i int, ctx context.Context, key authority.Key, v authority.StoreVersion) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := b.s.CompareExchangeAuthority(ctx, key, v, authority.Put([]byte(fmt.Sprintf("v%d", i))))
			outs[i] = casOutcome{res, err}
		}()
	}
	cas(0, context.Background(), b.keys[0], b.rows[0].StoreVersion)
	require.Eventually(t, func() bool { return b.g.txns.Load() == before+1 }, 5*time.Second, time.Millisecond, "the first CAS holds the slot")
	for i := range keys {
		cas(i+1, ctxs[i], keys[i], expected[i])
	}
	require.Eventually(t, func() bool { return etcdstore.QueuedWrites(b.s) == len(keys) }, 5*time.Second, time.Millisecond, "the others queue")
	return func() []casOutcome {
		release()
		wg.Wait()
		return outs
	}
}

func (b *batchFixture) rest() ([]context.Context, []authority.Key, []authority.StoreVersion) {
	var ctxs []context.Context
	var keys []authority.Key
	var vs []authority.StoreVersion
	for i, r := range b.rows[1:] {
		ctxs, keys, vs = append(ctxs, context.Background()), append(keys, b.keys[i+1]), append(vs, r.StoreVersion)
	}
	return ctxs, keys, vs
}

// TestBatchMergesQueuedWrites: writes queued behind a busy slot go out as
// one Txn, and each gets its own row's outcome.
func TestBatchMergesQueuedWrites(t *testing.T) {
	b := newBatchFixture(t, 8)
	ctxs, keys, vs := b.rest()
	before := b.g.txns.Load()
	outs := b.queue(t, ctxs, keys, vs)()
	require.Equal(t, before+2, b.g.txns.Load(), "the held Txn, then one Txn for the 7 queued writes")
	require.Equal(t, 7, b.g.lastOps)
	require.Equal(t, 7+7+1+1+1, b.g.lastCmps, "each row's version and row lock, and once the owner's liveness, the active version (the compact format's fence) and the shard map key (the standing fence) they all compare")
	versions := map[authority.StoreVersion]int{}
	for i, o := range outs {
		require.NoError(t, o.err)
		require.Equal(t, authority.KindStored, o.res.Kind)
		row := b.fx.MustRow(b.keys[i])
		require.Equal(t, row.StoreVersion, o.res.Snapshot.StoreVersion)
		require.Equal(t, []byte(fmt.Sprintf("v%d", i)), row.Payload)
		versions[row.StoreVersion]++
	}
	require.Len(t, versions, 2, "the merged writes share their Txn's revision")
	st := b.s.WriteStats()
	require.Equal(t, etcdstore.WriteStats{Txns: st.Txns, Batches: 1, BatchedWrites: 7}, st)
	// every row is still usable through its new version
	for i := range outs {
		b.fx.Put(b.keys[i], outs[i].res.Snapshot.StoreVersion, []byte("again"))
	}
}

// TestBatchStaleMemberDecidedAlone: when one member's compare fails, the
// merged Txn writes nothing; the stale member is sent alone and gets its
// conflict with the current row, the others are merged again and stored.
func TestBatchStaleMemberDecidedAlone(t *testing.T) {
	b := newBatchFixture(t, 6)
	// another store moves row 3 on: this store's cached version is stale
	other := newStore(t, nil, etcdstore.Config{Clock: b.clock, Namespace: b.s.Namespace(), SkipVersionCheck: true})
	moved, err := other.CompareExchangeAuthority(context.Background(), b.keys[3], b.rows[3].StoreVersion, authority.Put([]byte("moved")))
	require.NoError(t, err)
	require.Equal(t, authority.KindStored, moved.Kind)
	ctxs, keys, vs := b.rest()
	before := b.g.txns.Load()
	outs := b.queue(t, ctxs, keys, vs)()
	require.Equal(t, before+1+1+1+1, b.g.txns.Load(), "held, the failed merged Txn, the 4 others merged again, row 3 alone")
	require.Equal(t, int64(1), b.s.WriteStats().Fallbacks)
	for i, o := range outs {
		require.NoError(t, o.err)
		if i == 3 {
			require.Equal(t, authority.KindConflict, o.res.Kind)
			require.Equal(t, moved.Snapshot.StoreVersion, o.res.Current.Snapshot.StoreVersion)
			require.Equal(t, []byte("moved"), b.fx.MustRow(b.keys[3]).Payload)
			continue
		}
		require.Equal(t, authority.KindStored, o.res.Kind, "row %d", i)
		require.Equal(t, []byte(fmt.Sprintf("v%d", i)), b.fx.MustRow(b.keys[i]).Payload)
	}
}

// TestBatchKeepsDependentWritesApart: two writes of one row never share a
// Txn (etcd would refuse the duplicate key, and both compares would hold):
// exactly one wins.
func TestBatchKeepsDependentWritesApart(t *testing.T) {
	b := newBatchFixture(t, 3)
	ctxs := []context.Context{context.Background(), context.Background(), context.Background()}
	keys := []authority.Key{b.keys[1], b.keys[1], b.keys[2]}
	vs := []authority.StoreVersion{b.rows[1].StoreVersion, b.rows[1].StoreVersion, b.rows[2].StoreVersion}
	before := b.g.txns.Load()
	outs := b.queue(t, ctxs, keys, vs)()
	require.Equal(t, before+3, b.g.txns.Load(), "held, one Txn with a write of row 1 and row 2, one with the other write of row 1")
	kinds := map[authority.ResultKind]int{}
	for _, o := range outs[1:3] {
		require.NoError(t, o.err)
		kinds[o.res.Kind]++
	}
	require.Equal(t, map[authority.ResultKind]int{authority.KindStored: 1, authority.KindConflict: 1}, kinds)
	require.Equal(t, authority.KindStored, outs[3].res.Kind)
}

// TestBatchOutcomeUnknown: a merged Txn whose reply is lost leaves every
// member's outcome unknown, as it would alone.
func TestBatchOutcomeUnknown(t *testing.T) {
	b := newBatchFixture(t, 4)
	ctxs, keys, vs := b.rest()
	b.g.mu.Lock()
	b.g.fail = status.Error(codes.Unavailable, "error reading from server: EOF")
	b.g.mu.Unlock()
	outs := b.queue(t, ctxs, keys, vs)()
	require.NoError(t, outs[0].err)
	for _, o := range outs[1:] {
		require.ErrorIs(t, o.err, authority.ErrOutcomeUnknown)
	}
}

// TestBatchRefusedTxnRetriedAlone: a merged Txn etcd refused as a whole
// (here: a lease it no longer knows) wrote nothing; each member is sent
// alone and keeps its own outcome.
func TestBatchRefusedTxnRetriedAlone(t *testing.T) {
	b := newBatchFixture(t, 4)
	ctxs, keys, vs := b.rest()
	b.g.mu.Lock()
	b.g.fail = rpctypes.ErrLeaseNotFound
	b.g.mu.Unlock()
	outs := b.queue(t, ctxs, keys, vs)()
	for i, o := range outs {
		require.NoError(t, o.err)
		require.Equal(t, authority.KindStored, o.res.Kind)
		require.Equal(t, []byte(fmt.Sprintf("v%d", i)), b.fx.MustRow(b.keys[i]).Payload)
	}
}

// TestBatchCancelledWhileQueued: a write whose context ends while it waits
// for a slot is never sent: a definite ErrUnavailable, the row unchanged.
func TestBatchCancelledWhileQueued(t *testing.T) {
	b := newBatchFixture(t, 3)
	ctxs, keys, vs := b.rest()
	ctx, cancel := context.WithCancel(context.Background())
	ctxs[0] = ctx
	finish := b.queue(t, ctxs, keys, vs)
	cancel()
	require.Eventually(t, func() bool { return etcdstore.QueuedWrites(b.s) == 1 }, 5*time.Second, time.Millisecond)
	outs := finish()
	require.ErrorIs(t, outs[1].err, authority.ErrUnavailable)
	require.ErrorIs(t, outs[1].err, context.Canceled)
	require.False(t, errors.Is(outs[1].err, authority.ErrOutcomeUnknown))
	require.Equal(t, b.rows[1].StoreVersion, b.fx.MustRow(b.keys[1]).StoreVersion)
	require.Equal(t, authority.KindStored, outs[2].res.Kind)
}

// TestBatchErrorAfterApply: a merged Txn that applied but whose reply is an
// error that does not prove the contrary (here a stopping leader's) leaves
// every member's outcome unknown; none is re-sent (it would then conflict
// with its own write and report a definite, wrong answer).
func TestBatchErrorAfterApply(t *testing.T) {
	b := newBatchFixture(t, 4)
	ctxs, keys, vs := b.rest()
	b.g.mu.Lock()
	b.g.failLate = rpctypes.ErrStopped
	b.g.mu.Unlock()
	before := b.g.txns.Load()
	outs := b.queue(t, ctxs, keys, vs)()
	require.Equal(t, before+2, b.g.txns.Load(), "held, the merged Txn, nothing sent again")
	for i, o := range outs[1:] {
		require.ErrorIs(t, o.err, authority.ErrOutcomeUnknown)
		require.Equal(t, []byte(fmt.Sprintf("v%d", i+1)), b.fx.MustRow(b.keys[i+1]).Payload, "it did apply")
	}
}

// TestBatchCloseFailsQueuedWrites: closing the store fails the writes still
// queued with ErrClosed, unsent.
func TestBatchCloseFailsQueuedWrites(t *testing.T) {
	b := newBatchFixture(t, 4)
	ctxs, keys, vs := b.rest()
	other := newStore(t, nil, etcdstore.Config{Clock: b.clock, Namespace: b.s.Namespace(), SkipVersionCheck: true})
	finish := b.queue(t, ctxs, keys, vs)
	require.NoError(t, b.s.Close())
	outs := finish()
	for i, o := range outs[1:] {
		require.ErrorIs(t, o.err, authority.ErrClosed)
		cur, err := other.ReadAuthority(context.Background(), b.keys[i+1])
		require.NoError(t, err)
		require.Equal(t, b.rows[i+1].StoreVersion, cur.Snapshot.StoreVersion, "not sent")
	}
}

// TestBatchLostLeaseRetriedAlone: the shared lease of the reservation
// terminals is gone (revoked behind the store's back) while aborts queue;
// the merged Txn is refused as a whole, each abort is sent alone, finds its
// lease gone, takes a new one and aborts.
func TestBatchLostLeaseRetriedAlone(t *testing.T) {
	b := newBatchFixture(t, 1) // row 0 holds the slot
	ctx := context.Background()
	rs := make([]conformance.Reservation, 4)
	for i := range rs {
		rs[i] = b.fx.Reserve(authority.ObjectUserSpot, fmt.Sprintf("lease-%d", i), conformance.TargetA)
	}
	// an abort writes a reservation terminal on the bucket's lease (a
	// commit, from storeversion.FewerKeys on, none): the lease the warm-up
	// abort's terminal sits on
	warm, err := b.s.Abort(ctx, b.fx.Reserve(authority.ObjectUserSpot, "warm", conformance.TargetA).AbortRequest())
	require.NoError(t, err)
	require.Equal(t, authority.KindAborted, warm.Kind)
	terms, err := shared.Get(ctx, b.s.Namespace()+"reservations/", clientv3.WithPrefix())
	require.NoError(t, err)
	require.NotEmpty(t, terms.Kvs)
	lease := clientv3.LeaseID(terms.Kvs[0].Lease)
	require.NotZero(t, lease)

	release := b.g.hold()
	before := b.g.txns.Load()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = b.s.CompareExchangeAuthority(ctx, b.keys[0], b.rows[0].StoreVersion, authority.Put([]byte("v0")))
	}()
	require.Eventually(t, func() bool { return b.g.txns.Load() == before+1 }, 5*time.Second, time.Millisecond)
	outs := make([]error, len(rs))
	for i := range rs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := b.s.Abort(ctx, rs[i].AbortRequest())
			if err == nil && res.Kind != authority.KindAborted {
				err = fmt.Errorf("abort %d: %s", i, res.Kind)
			}
			outs[i] = err
		}()
	}
	require.Eventually(t, func() bool { return etcdstore.QueuedWrites(b.s) == len(rs) }, 5*time.Second, time.Millisecond)
	_, err = shared.Revoke(ctx, lease)
	require.NoError(t, err)
	release()
	wg.Wait()
	require.NoError(t, errors.Join(outs...))
	require.Equal(t, int64(1), b.s.WriteStats().Fallbacks, "the merged aborts were refused once")
	for i := range rs {
		b.fx.RequireMissing(rs[i].Key)
		res, err := b.s.Abort(ctx, rs[i].AbortRequest())
		require.NoError(t, err)
		require.Equal(t, authority.KindAlreadyAborted, res.Kind, "abort %d's terminal was written", i)
	}
}
