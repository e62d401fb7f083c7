package txnkit

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	authority "github.com/zlink-systems/authority"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestBatchTakeKeepsMembersIndependent: a batch takes, in arrival order,
// the writes that neither write a key another member writes or compares nor
// compare a key another member writes; the rest wait for the next batch.
func TestBatchTakeKeepsMembersIndependent(t *testing.T) {
	b := NewBatcher(BatcherConfig{Slots: 1, Limits: Limits{MaxOps: 128, MaxBytes: maxRequestBytes}})
	mk := func(name string, compares []string, writes ...string) *queuedTxn {
		tx := &Txn{}
		for _, k := range compares {
			tx.Cmp(modRevIs(k, 1))
		}
		for _, k := range writes {
			tx.Put(k, name)
		}
		w, c, ok := keysOf(tx)
		require.True(t, ok)
		return &queuedTxn{t: tx, writes: w, compares: c, done: make(chan struct{})}
	}
	a := mk("a", []string{"x", "live"}, "x")
	bb := mk("b", []string{"y", "x"}, "y")   // compares x, which a writes
	c := mk("c", []string{"z", "live"}, "z") // shares only a compared key
	d := mk("d", []string{"w"}, "live")      // writes a key a and c compare
	e := mk("e", nil, "x")                   // writes x again
	f := mk("f", []string{"v"}, "v")
	b.queue = []*queuedTxn{a, bb, c, d, e, f}
	require.Equal(t, []*queuedTxn{a, c, f}, b.take())
	require.Equal(t, []*queuedTxn{bb, d, e}, b.queue)
	require.True(t, a.taken && c.taken && f.taken && !bb.taken)
	require.Equal(t, []*queuedTxn{bb, d}, b.take()) // bb compares x: no one writes it now; d writes live
	require.Equal(t, []*queuedTxn{e}, b.take())
	require.Empty(t, b.take())
}

// TestBatchTakeRespectsLimits: a batch stops at the Txn op limit.
func TestBatchTakeRespectsLimits(t *testing.T) {
	b := NewBatcher(BatcherConfig{Slots: 1, Limits: Limits{MaxOps: 8, MaxBytes: maxRequestBytes}})
	for i := range 5 {
		tx := &Txn{}
		tx.Cmp(modRevIs(string(rune('a'+i)), 1))
		tx.Put(string(rune('a'+i)), "v")
		tx.Put(string(rune('A'+i)), "v")
		tx.Put(string(rune('0'+i)), "v")
		w, c, _ := keysOf(tx)
		b.queue = append(b.queue, &queuedTxn{t: tx, writes: w, compares: c})
	}
	require.Len(t, b.take(), 2) // 3 ops each: 6 ≤ 8 < 9
	require.Len(t, b.take(), 2)
	require.Len(t, b.take(), 1)
}

// TestBatchKeysOf: range compares and reads among the ops keep a write
// out of batches.
func TestBatchKeysOf(t *testing.T) {
	tx := &Txn{}
	tx.Cmp(clientv3.Compare(clientv3.ModRevision("p/"), "<", 5).WithRange("p0"))
	tx.Put("k", "v")
	_, _, ok := keysOf(tx)
	require.False(t, ok)
	tx = &Txn{Then: []clientv3.Op{clientv3.OpGet("k")}}
	_, _, ok = keysOf(tx)
	require.False(t, ok)
	tx = &Txn{Then: []clientv3.Op{clientv3.OpDelete("a", clientv3.WithRange("b"))}}
	_, _, ok = keysOf(tx)
	require.False(t, ok)
	tx = &Txn{}
	tx.Cmp(modRevIs("k", 0))
	tx.Put("k", "v")
	tx.Del("j")
	w, c, ok := keysOf(tx)
	require.True(t, ok)
	require.Equal(t, []string{"k", "j"}, w)
	require.Equal(t, []string{"k"}, c)
}

// recordingSend answers every Txn with success at revision 42 and records
// the Then ops of each.
func recordingSend(thens *[][]clientv3.Op) func(context.Context, *Txn) (*clientv3.TxnResponse, error) {
	return func(_ context.Context, t *Txn) (*clientv3.TxnResponse, error) {
		then := t.ThenOps()
		*thens = append(*thens, then)
		resp := &clientv3.TxnResponse{Header: &etcdserverpb.ResponseHeader{Revision: 42}, Succeeded: true}
		for range then {
			resp.Responses = append(resp.Responses, &etcdserverpb.ResponseOp{Response: &etcdserverpb.ResponseOp_ResponsePut{ResponsePut: &etcdserverpb.PutResponse{}}})
		}
		return resp, nil
	}
}

// TestBatchRunSkipsMembersThatGaveUp: a member whose caller gave up after
// it was taken into a batch, but before the batch was sent, is not sent:
// its outcome is a definite ErrUnavailable, and the others go on.
func TestBatchRunSkipsMembersThatGaveUp(t *testing.T) {
	var thens [][]clientv3.Op
	b := NewBatcher(BatcherConfig{Slots: 1, Limits: Limits{MaxOps: 128, MaxBytes: maxRequestBytes}, Send: recordingSend(&thens)})
	mk := func(ctx context.Context, key string) *queuedTxn {
		tx := &Txn{}
		tx.Cmp(modRevIs(key, 1))
		tx.Put(key, "v")
		w, c, _ := keysOf(tx)
		return &queuedTxn{ctx: ctx, t: tx, writes: w, compares: c, done: make(chan struct{}), taken: true}
	}
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	a, x, c := mk(context.Background(), "a"), mk(gone, "x"), mk(context.Background(), "c")
	b.run([]*queuedTxn{a, x, c})
	for _, q := range []*queuedTxn{a, x, c} {
		<-q.done
	}
	require.ErrorIs(t, x.err, authority.ErrUnavailable)
	require.ErrorIs(t, x.err, context.Canceled)
	require.False(t, errors.Is(x.err, authority.ErrOutcomeUnknown))
	require.Len(t, thens, 1)
	var sent []string
	for _, op := range thens[0] {
		sent = append(sent, string(op.KeyBytes()))
	}
	require.Equal(t, []string{"a", "c"}, sent)
	for _, q := range []*queuedTxn{a, c} {
		require.NoError(t, q.err)
		require.True(t, q.resp.Succeeded)
		require.Len(t, q.resp.Responses, 1, "its own op's response")
		require.Equal(t, int64(42), q.resp.Header.Revision)
	}
}

// TestBatchHolds: a failed merged Txn's Else reads decide every member's
// compares as etcd would (absent keys have revision and version 0).
func TestBatchHolds(t *testing.T) {
	kvs := map[string]*mvccpb.KeyValue{
		"row":  {Key: []byte("row"), ModRevision: 7, CreateRevision: 3, Version: 2},
		"live": {Key: []byte("live"), ModRevision: 5, CreateRevision: 5, Version: 1},
	}
	keys := []string{"row", "live", "gone"}
	resp := &clientv3.TxnResponse{}
	compared := map[string]int{}
	for i, k := range keys {
		compared[k] = i
		rr := &etcdserverpb.RangeResponse{}
		if kv := kvs[k]; kv != nil {
			rr.Kvs = []*mvccpb.KeyValue{kv}
		}
		resp.Responses = append(resp.Responses, &etcdserverpb.ResponseOp{Response: &etcdserverpb.ResponseOp_ResponseRange{ResponseRange: rr}})
	}
	for _, tc := range []struct {
		name string
		cmp  clientv3.Cmp
		want bool
	}{
		{"mod equal", clientv3.Compare(clientv3.ModRevision("row"), "=", 7), true},
		{"mod stale", clientv3.Compare(clientv3.ModRevision("row"), "=", 6), false},
		{"absent is mod 0", clientv3.Compare(clientv3.ModRevision("gone"), "=", 0), true},
		{"present is not mod 0", clientv3.Compare(clientv3.ModRevision("row"), "=", 0), false},
		{"live", clientv3.Compare(clientv3.CreateRevision("live"), ">", 0), true},
		{"not live", clientv3.Compare(clientv3.CreateRevision("gone"), ">", 0), false},
		{"version less", clientv3.Compare(clientv3.Version("row"), "<", 3), true},
		{"version not equal", clientv3.Compare(clientv3.Version("row"), "!=", 2), false},
		{"value undecidable", clientv3.Compare(clientv3.Value("row"), "=", "x"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tx := &Txn{}
			tx.Cmp(tc.cmp)
			require.Equal(t, tc.want, holds(&queuedTxn{t: tx}, ReadsOf(resp)))
		})
	}
}

// TestBatchCmpID: equal compares share an ID, any difference separates them.
func TestBatchCmpID(t *testing.T) {
	id := func(c clientv3.Cmp) string { return cmpID(&c) }
	live := clientv3.Compare(clientv3.CreateRevision("live"), ">", 0)
	require.Equal(t, id(live), id(clientv3.Compare(clientv3.CreateRevision("live"), ">", 0)))
	for _, other := range []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision("live2"), ">", 0),
		clientv3.Compare(clientv3.CreateRevision("live"), "=", 0),
		clientv3.Compare(clientv3.ModRevision("live"), ">", 0),
		clientv3.Compare(clientv3.CreateRevision("live"), ">", 1),
		clientv3.Compare(clientv3.CreateRevision("live"), ">", 0).WithRange("livf"),
	} {
		require.NotEqual(t, id(live), id(other))
	}
}

// maxRequestBytes is etcd's default --max-request-bytes (1.5 MiB).
const maxRequestBytes = 1572864

// modRevIs compares a key's ModRevision (0: the key is absent).
func modRevIs(key string, rev int64) clientv3.Cmp {
	return clientv3.Compare(clientv3.ModRevision(key), "=", rev)
}
