package etcdpage_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/zlink-systems/authority/internal/etcdpage"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// limit is the receive limit of the test's reading client: four values of
// valueSize fit in one response, five do not.
const (
	limit     = 64 * 1024
	valueSize = 14 * 1024
)

// spyKV counts range requests and runs before (when set) ahead of each.
type spyKV struct {
	clientv3.KV
	gets   int
	before func(n int)
}

func (s *spyKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	s.gets++
	if s.before != nil {
		s.before(s.gets)
	}
	return s.KV.Get(ctx, key, opts...)
}

func keysOf(kvs []*mvccpb.KeyValue) []string {
	out := make([]string, len(kvs))
	for i, kv := range kvs {
		out[i] = string(kv.Key)
	}
	return out
}

func TestRead(t *testing.T) {
	srv := etcdtest.Start(t)
	writer := srv.Client(t)
	reader := srv.ClientWith(t, func(cfg *clientv3.Config) {
		cfg.MaxCallSendMsgSize, cfg.MaxCallRecvMsgSize = limit, limit
	})
	ctx := context.Background()
	ns := etcdtest.Namespace()
	t.Cleanup(func() { _, _ = writer.Delete(context.Background(), ns, clientv3.WithPrefix()) })
	key := func(i int) string { return fmt.Sprintf("%sk%02d", ns, i) }
	for i := range 10 {
		_, err := writer.Put(ctx, key(i), strings.Repeat("v", valueSize))
		require.NoError(t, err)
	}
	end := clientv3.GetPrefixRangeEnd(ns)

	t.Run("a page over the receive limit is read in parts at one revision", func(t *testing.T) {
		_, err := reader.Get(ctx, ns, clientv3.WithRange(end), clientv3.WithLimit(10))
		require.True(t, etcdpage.TooLarge(err), "the whole page in one response: %v", err)
		late := 5
		kv := &spyKV{KV: reader, before: func(n int) {
			if n == 3 { // between the parts: not in the page
				_, err := writer.Put(ctx, key(late), "rewritten")
				require.NoError(t, err)
				_, err = writer.Put(ctx, ns+"k03a", "new")
				require.NoError(t, err)
			}
		}}
		p, err := etcdpage.Read(ctx, kv, ns, end, 0, 8)
		require.NoError(t, err)
		require.Equal(t, []string{key(0), key(1), key(2), key(3), key(4), key(5), key(6), key(7)}, keysOf(p.Kvs))
		for _, e := range p.Kvs {
			require.Equal(t, valueSize, len(e.Value), "%s", e.Key)
		}
		require.True(t, p.More)
		require.Greater(t, kv.gets, 2)
		_, err = writer.Delete(ctx, ns+"k03a")
		require.NoError(t, err)
		_, err = writer.Put(ctx, key(late), strings.Repeat("v", valueSize))
		require.NoError(t, err)
	})

	t.Run("a page that fits is one request", func(t *testing.T) {
		kv := &spyKV{KV: reader}
		p, err := etcdpage.Read(ctx, kv, ns, end, 0, 4)
		require.NoError(t, err)
		require.Len(t, p.Kvs, 4)
		require.True(t, p.More)
		require.Equal(t, 1, kv.gets)
		p, err = etcdpage.Read(ctx, kv, key(6), end, p.Revision, 4)
		require.NoError(t, err)
		require.Len(t, p.Kvs, 4)
		require.False(t, p.More, "the range ends with the page")
	})

	t.Run("All reads every key at one revision", func(t *testing.T) {
		first := true
		kv := &spyKV{KV: reader, before: func(n int) {
			if n == 2 && first {
				first = false
				_, err := writer.Put(ctx, ns+"k99", "after")
				require.NoError(t, err)
			}
		}}
		kvs, rev, err := etcdpage.All(ctx, kv, ns, 0, 3)
		require.NoError(t, err)
		want := make([]string, 10)
		for i := range want {
			want[i] = key(i)
		}
		require.Equal(t, want, keysOf(kvs))
		require.Positive(t, rev)
		kvs, _, err = etcdpage.All(ctx, reader, ns, 0, 500, clientv3.WithKeysOnly())
		require.NoError(t, err)
		require.Equal(t, append(want, ns+"k99"), keysOf(kvs))
		require.Empty(t, kvs[0].Value)
		_, err = writer.Delete(ctx, ns+"k99")
		require.NoError(t, err)
	})

	t.Run("a single key over the receive limit fails", func(t *testing.T) {
		_, err := writer.Put(ctx, ns+"k05", strings.Repeat("h", limit+1))
		require.NoError(t, err)
		_, err = etcdpage.Read(ctx, reader, ns, end, 0, 10)
		require.True(t, etcdpage.TooLarge(err), "%v", err)
	})
}

func TestTooLargeIsOnlyTheReceiveLimit(t *testing.T) {
	require.False(t, etcdpage.TooLarge(nil))
	require.False(t, etcdpage.TooLarge(rpctypes.ErrTooManyRequests))
	require.False(t, etcdpage.TooLarge(rpctypes.ErrGRPCRequestTooManyRequests))
	require.False(t, etcdpage.TooLarge(rpctypes.ErrNoSpace))
	require.False(t, etcdpage.TooLarge(rpctypes.ErrGRPCNoSpace))
	require.False(t, etcdpage.TooLarge(context.DeadlineExceeded))
}
