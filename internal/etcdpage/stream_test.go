package etcdpage_test

import (
	"context"
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/zlink-systems/authority/internal/etcdpage"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestStream: Stream reads a page at one revision (a first page's, or the
// one given), says exactly whether keys follow, and reads a whole range
// when limit is unbounded.
func TestStream(t *testing.T) {
	srv := etcdtest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	ns := etcdtest.Namespace()
	key := func(i int) string { return fmt.Sprintf("%sk%02d", ns, i) }
	for i := range 30 {
		_, err := c.Put(ctx, key(i), "v")
		require.NoError(t, err)
	}
	end := clientv3.GetPrefixRangeEnd(ns)
	first, err := etcdpage.Stream(ctx, c, ns, end, 0, 10)
	require.NoError(t, err)
	require.Equal(t, []string{key(0), key(1), key(2), key(3), key(4), key(5), key(6), key(7), key(8), key(9)}, keysOf(first.Kvs))
	require.True(t, first.More)
	require.Positive(t, first.Revision)

	// changes after the first page are not in the pages read at its revision
	_, err = c.Put(ctx, key(12), "rewritten")
	require.NoError(t, err)
	_, err = c.Put(ctx, key(12)+"a", "new")
	require.NoError(t, err)
	next, err := etcdpage.Stream(ctx, c, key(9)+"\x00", end, first.Revision, 20)
	require.NoError(t, err)
	require.Len(t, next.Kvs, 20)
	require.Equal(t, key(10), string(next.Kvs[0].Key))
	require.Equal(t, key(29), string(next.Kvs[19].Key))
	require.Equal(t, "v", string(next.Kvs[2].Value))
	require.False(t, next.More, "exactly the rest of the range")
	require.Equal(t, first.Revision, next.Revision)

	all, err := etcdpage.Stream(ctx, c, ns, end, 0, math.MaxInt64)
	require.NoError(t, err)
	require.Len(t, all.Kvs, 31)
	require.False(t, all.More)
}

// getCounter counts a client's Gets (Scan sends none: the stream pins its
// own revision).
type getCounter struct {
	clientv3.KV
	gets int
}

func (g *getCounter) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	g.gets++
	return g.KV.Get(ctx, key, opts...)
}

// TestScan: Scan reads a page as it is now without asking for the revision
// first (no Get), says exactly whether keys follow, and reports the
// revision it read at only when it read to the range's end.
func TestScan(t *testing.T) {
	srv := etcdtest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	ns := etcdtest.Namespace()
	key := func(i int) string { return fmt.Sprintf("%sk%02d", ns, i) }
	for i := range 90 {
		_, err := c.Put(ctx, key(i), "v")
		require.NoError(t, err)
	}
	kv := &getCounter{KV: c.KV}
	end := clientv3.GetPrefixRangeEnd(ns)
	first, err := etcdpage.Scan(ctx, kv, ns, end, 10, clientv3.WithKeysOnly())
	require.NoError(t, err)
	require.Equal(t, []string{key(0), key(1), key(2), key(3), key(4), key(5), key(6), key(7), key(8), key(9)}, keysOf(first.Kvs))
	require.Empty(t, string(first.Kvs[0].Value), "keys only")
	require.True(t, first.More)
	require.Zero(t, first.Revision, "cut short before the range's last chunk: its revision was not sent")

	rest, err := etcdpage.Scan(ctx, kv, key(9)+"\x00", end, 80)
	require.NoError(t, err)
	require.Len(t, rest.Kvs, 80)
	require.Equal(t, key(10), string(rest.Kvs[0].Key))
	require.False(t, rest.More, "exactly the rest of the range")
	require.Positive(t, rest.Revision, "read to the end: the revision came with the last chunk")
	require.Zero(t, kv.gets)
}
