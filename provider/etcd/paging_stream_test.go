package etcd_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// pageSpyKV counts a client's ranged Gets (etcd counts every key to the
// range's end for them) and its range streams; with old set, it answers
// streams as a server before etcd 3.7 does.
type pageSpyKV struct {
	clientv3.KV
	ranged, streams *atomic.Int64
	old             bool
}

func (k pageSpyKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	if op := clientv3.OpGet(key, opts...); len(op.RangeBytes()) > 0 {
		k.ranged.Add(1)
	}
	return k.KV.Get(ctx, key, opts...)
}

func (k pageSpyKV) GetStream(ctx context.Context, key string, opts ...clientv3.OpOption) (clientv3.GetStreamChan, error) {
	k.streams.Add(1)
	if k.old {
		return nil, status.Error(codes.Unimplemented, "unknown method RangeStream for service etcdserverpb.KV")
	}
	return k.KV.GetStream(ctx, key, opts...)
}

// listThroughSpy fills rows Spots, lists them limit at a time through a
// pageSpyKV and returns the keys listed, the pages and the spy's counts.
func listThroughSpy(t *testing.T, old bool, rows, limit int) (keys []authority.Key, pages int, ranged, streams int64) {
	t.Helper()
	c := server.Client(t)
	spy := pageSpyKV{KV: c.KV, ranged: &atomic.Int64{}, streams: &atomic.Int64{}, old: old}
	c.KV = spy
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, c, etcdstore.Config{Clock: clock})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	for i := range rows {
		fx.Active(authority.ObjectUserSpot, fmt.Sprintf("page-%03d", i), conformance.TargetA)
	}
	spy.ranged.Store(0)
	var cursor authority.ScanCursor
	for {
		res, err := s.ListAuthorities(context.Background(), authority.KindPrefix(authority.ObjectUserSpot), cursor, limit)
		require.NoError(t, err)
		require.Equal(t, authority.KindPage, res.Kind)
		pages++
		for _, it := range res.Items {
			keys = append(keys, it.Key)
		}
		if cursor = res.NextCursor; cursor == "" {
			return keys, pages, spy.ranged.Load(), spy.streams.Load()
		}
	}
}

// TestListingPagesAreStreamed: a listing page is read through etcd's
// RangeStream, never with a ranged Get: etcd answers a Range with a limit
// after walking every key to the range's end to count them, so each page
// cost the rows after it (a 1000-row page 152 ms at 1M rows, 35 ms at 100k;
// BenchmarkRangeTail). The pages hold every row once, in key order, and the
// last page (exactly limit rows) has no cursor.
func TestListingPagesAreStreamed(t *testing.T) {
	keys, pages, ranged, streams := listThroughSpy(t, false, 20, 5)
	require.Len(t, keys, 20)
	for i, k := range keys {
		require.Equal(t, fmt.Sprintf("page-%03d", i), strings.SplitN(string(k), "/", 2)[1])
	}
	require.Equal(t, 4, pages)
	require.Zero(t, ranged, "ranged Gets")
	require.EqualValues(t, 4, streams)
}

// TestListingWithoutRangeStream: against a server without RangeStream
// (before etcd 3.7) a listing reads its pages with ranged Gets (in windows:
// etcdpage.ReadAfter), asking for a stream only once; the pages are the
// same.
func TestListingWithoutRangeStream(t *testing.T) {
	keys, pages, ranged, streams := listThroughSpy(t, true, 20, 5)
	require.Len(t, keys, 20)
	for i, k := range keys {
		require.Equal(t, fmt.Sprintf("page-%03d", i), strings.SplitN(string(k), "/", 2)[1])
	}
	require.Equal(t, 4, pages)
	require.GreaterOrEqual(t, ranged, int64(4), "ranged Gets")
	require.EqualValues(t, 1, streams)
}
