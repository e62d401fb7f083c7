package etcd_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/preflight"
	"github.com/zlink-systems/authority/provider/etcd/schema"
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
	mu              *sync.Mutex
	ends            *[]string // the range end of each ranged Get
}

func (k pageSpyKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	if op := clientv3.OpGet(key, opts...); len(op.RangeBytes()) > 0 {
		k.ranged.Add(1)
		k.mu.Lock()
		*k.ends = append(*k.ends, string(op.RangeBytes()))
		k.mu.Unlock()
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
// pageSpyKV and returns the keys listed, the pages, the spy's counts and
// how many ranged Gets ran to the end of the Spots' rows.
func listThroughSpy(t *testing.T, old bool, rows, limit int) (keys []authority.Key, pages int, ranged, streams int64, toEnd int) {
	t.Helper()
	c := server.Client(t)
	spy := pageSpyKV{KV: c.KV, ranged: &atomic.Int64{}, streams: &atomic.Int64{}, old: old, mu: &sync.Mutex{}, ends: new([]string)}
	c.KV = spy
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, c, etcdstore.Config{Clock: clock})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	for i := range rows {
		fx.Active(authority.ObjectUserSpot, fmt.Sprintf("page-%03d", i), conformance.TargetA)
	}
	spy.ranged.Store(0)
	spy.mu.Lock()
	*spy.ends = nil
	spy.mu.Unlock()
	end := clientv3.GetPrefixRangeEnd(schema.Prefix(s.Namespace(), schema.EntryRow) + authority.KindPrefix(authority.ObjectUserSpot))
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
			spy.mu.Lock()
			defer spy.mu.Unlock()
			for _, e := range *spy.ends {
				if e == end {
					toEnd++
				}
			}
			return keys, pages, spy.ranged.Load(), spy.streams.Load(), toEnd
		}
	}
}

// TestListingPagesAreStreamed: etcd answers a ranged Get with a limit
// after walking every key to the range's end to count them, so a page read
// that way cost the rows after it (a 1000-row page 152 ms at 1M rows, 35 ms
// at 100k; BenchmarkRangeTail) and a listing was quadratic in its rows. A
// first page is streamed (RangeStream does not count) and every page after
// it is read in windows around its cursor: only the last page's read runs
// to the end of the Spots' rows (it must find that no row follows). The pages hold every row once, in key order, and the last
// page (exactly limit rows) has no cursor.
func TestListingPagesAreStreamed(t *testing.T) {
	st, err := shared.Status(context.Background(), shared.Endpoints()[0])
	require.NoError(t, err)
	if !preflight.ServerVersionAtLeast(st.Version, "3.7.0") {
		t.Skipf("etcd %s has no RangeStream (3.7): TestListingWithoutRangeStream covers it", st.Version)
	}
	keys, pages, _, streams, toEnd := listThroughSpy(t, false, 20, 5)
	require.Len(t, keys, 20)
	for i, k := range keys {
		require.Equal(t, fmt.Sprintf("page-%03d", i), strings.SplitN(string(k), "/", 2)[1])
	}
	require.Equal(t, 4, pages)
	require.EqualValues(t, 1, streams, "first page streamed")
	require.Equal(t, 1, toEnd, "ranged Gets to the end of the rows: the last page's")
}

// TestListingWithoutRangeStream: against a server without RangeStream
// (before etcd 3.7) a first page is one ranged Get, asking for a stream
// only once; the pages after it still read in windows (the last one to the
// end).
func TestListingWithoutRangeStream(t *testing.T) {
	keys, pages, _, streams, toEnd := listThroughSpy(t, true, 20, 5)
	require.Len(t, keys, 20)
	for i, k := range keys {
		require.Equal(t, fmt.Sprintf("page-%03d", i), strings.SplitN(string(k), "/", 2)[1])
	}
	require.Equal(t, 4, pages)
	require.EqualValues(t, 1, streams)
	require.Equal(t, 2, toEnd, "ranged Gets to the end of the rows: the first and the last page's")
}
