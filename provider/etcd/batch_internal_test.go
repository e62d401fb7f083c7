package etcd

import (
	"testing"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestBatchTakeKeepsMembersIndependent: a batch takes, in arrival order,
// the writes that neither write a key another member writes or compares nor
// compare a key another member writes; the rest wait for the next batch.
func TestBatchTakeKeepsMembersIndependent(t *testing.T) {
	s := &Store{maxOps: 128, maxBytes: DefaultMaxRequestBytes}
	b := newWriteBatcher(s, 1)
	mk := func(name string, compares []string, writes ...string) *queuedTxn {
		tx := &txn{}
		for _, k := range compares {
			tx.cmp(modRevIs(k, 1))
		}
		for _, k := range writes {
			tx.put(k, name)
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
	s := &Store{maxOps: 8, maxBytes: DefaultMaxRequestBytes}
	b := newWriteBatcher(s, 1)
	for i := range 5 {
		tx := &txn{}
		tx.cmp(modRevIs(string(rune('a'+i)), 1))
		tx.put(string(rune('a'+i)), "v")
		tx.put(string(rune('A'+i)), "v")
		tx.put(string(rune('0'+i)), "v")
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
	tx := &txn{}
	tx.cmp(clientv3.Compare(clientv3.ModRevision("p/"), "<", 5).WithRange("p0"))
	tx.put("k", "v")
	_, _, ok := keysOf(tx)
	require.False(t, ok)
	tx = &txn{then: []clientv3.Op{clientv3.OpGet("k")}}
	_, _, ok = keysOf(tx)
	require.False(t, ok)
	tx = &txn{then: []clientv3.Op{clientv3.OpDelete("a", clientv3.WithRange("b"))}}
	_, _, ok = keysOf(tx)
	require.False(t, ok)
	tx = &txn{}
	tx.cmp(modRevIs("k", 0))
	tx.put("k", "v")
	tx.del("j")
	w, c, ok := keysOf(tx)
	require.True(t, ok)
	require.Equal(t, []string{"k", "j"}, w)
	require.Equal(t, []string{"k"}, c)
}
