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
	"github.com/zlink-systems/authority/provider/etcd/storeversion"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// getRecorder is a KV that records the start key of every Get and range
// stream.
type getRecorder struct {
	clientv3.KV
	mu     sync.Mutex
	starts []string
}

func (r *getRecorder) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	r.mu.Lock()
	r.starts = append(r.starts, key)
	r.mu.Unlock()
	return r.KV.Get(ctx, key, opts...)
}

func (r *getRecorder) GetStream(ctx context.Context, key string, opts ...clientv3.OpOption) (clientv3.GetStreamChan, error) {
	r.mu.Lock()
	r.starts = append(r.starts, key)
	r.mu.Unlock()
	return r.KV.GetStream(ctx, key, opts...)
}

// RemoveAllByOwner reads the owner index a page at a time, each page from
// after the last removed row, and removes a page in Txn-sized batches. etcd
// walks a limited range to its end (it counts every key, and the tombstones
// of deleted keys until compaction), so reading one batch at a time, or
// from the owner's prefix every time, made removing an owner quadratic in
// its rows (TestScale: 100k rows at 712 rows/s). Only the first read and
// the final check for rows added behind the cursor start at the prefix. So
// it is in either layout: the owner index before storeversion.FewerKeys,
// the owner's placement keys on its node lifecycle from it on.
func TestRemoveAllByOwnerReadsPastRemovedBatches(t *testing.T) {
	layouts := map[string]struct {
		version storeversion.Version
		index   func(ns string) string
	}{
		"owner index": {storeversion.FewerKeys - 1, func(ns string) string { return schema.Prefix(ns, schema.EntryOwnerIndex) }},
		"placement keys": {storeversion.FewerKeys, func(ns string) string {
			return schema.NewLayout(ns).PlacementOwnerPrefix(conformance.NodeA, conformance.NodeLifecycle, conformance.TargetA.Owner)
		}},
	}
	for name, layout := range layouts {
		t.Run(name, func(t *testing.T) { removeReadsPastRemovedBatches(t, layout.version, layout.index) })
	}
}

func removeReadsPastRemovedBatches(t *testing.T, version storeversion.Version, indexPrefix func(ns string) string) {
	c := server.ClientWith(t, func(*clientv3.Config) {})
	rec := &getRecorder{KV: c.KV}
	c.KV = rec
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, c, etcdstore.Config{Clock: clock, MaxTxnOps: 10, Namespace: namespaceAt(t, version)}) // 2 rows a batch
	etcdstore.SetOwnerIndexPage(t, 5)                                                                      // 3 batches a page, the last one short
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	const rows = 12
	for i := range rows {
		fx.Active(authority.ObjectUserSpot, fmt.Sprintf("rm-%02d", i), conformance.TargetA)
	}
	prefix := indexPrefix(s.Namespace())
	rec.mu.Lock()
	rec.starts = nil
	rec.mu.Unlock()
	removed, err := s.RemoveAllByOwner(context.Background(), conformance.TargetA.Owner)
	require.NoError(t, err)
	require.Equal(t, int64(rows), removed)
	for i := range rows {
		fx.RequireMissing(fx.Key(authority.ObjectUserSpot, fmt.Sprintf("rm-%02d", i)))
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var index []string
	for _, k := range rec.starts {
		if strings.HasPrefix(k, prefix) {
			index = append(index, k)
		}
	}
	// 12 rows in pages of 5: 3 pages (the last says nothing follows) and
	// the final empty read from the prefix (a read a batch would be 6 + 2);
	// a server without RangeStream reads a page in windows, several reads
	st, err := shared.Status(context.Background(), shared.Endpoints()[0])
	require.NoError(t, err)
	if preflight.ServerVersionAtLeast(st.Version, "3.7.0") {
		require.Len(t, index, 4, "one index read a page: %q", index)
	}
	atPrefix := 0
	for i, k := range index {
		if strings.HasSuffix(k, "/") {
			atPrefix++
			continue
		}
		require.Greater(t, k, index[i-1], "read %d goes back", i)
	}
	if preflight.ServerVersionAtLeast(st.Version, "3.7.0") {
		require.Equal(t, 2, atPrefix, "index reads starting at the owner's prefix: %q", index)
	} else {
		// the windowed fallback also reads the first page's revision at the
		// prefix; a read from the prefix a batch would be 6 or more
		require.Contains(t, []int{2, 3}, atPrefix, "index reads starting at the owner's prefix: %q", index)
	}
}

// On etcd 3.7 RemoveAllByOwner streams its owner index a page at a time:
// no read of the index is a counted range (a ranged Get with a limit,
// which etcd answers after walking the whole rest of the range to count
// it, so each page of the earlier fixed 2048-key pages cost every entry
// after it: quadratic in the owner's rows).
func TestRemoveAllByOwnerStreamsItsIndex(t *testing.T) {
	st, err := shared.Status(context.Background(), shared.Endpoints()[0])
	require.NoError(t, err)
	if !preflight.ServerVersionAtLeast(st.Version, "3.7.0") {
		t.Skipf("etcd %s has no RangeStream (3.7): its index pages are read in windows", st.Version)
	}
	c := server.Client(t)
	spy := pageSpyKV{KV: c.KV, ranged: &atomic.Int64{}, streams: &atomic.Int64{}, mu: &sync.Mutex{}, ends: new([]string)}
	c.KV = spy
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, c, etcdstore.Config{Clock: clock, MaxTxnOps: 8})
	etcdstore.SetOwnerIndexPage(t, 5)
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	const rows = 12
	for i := range rows {
		fx.Active(authority.ObjectUserSpot, fmt.Sprintf("rm-%02d", i), conformance.TargetA)
	}
	spy.mu.Lock()
	*spy.ends = nil
	spy.mu.Unlock()
	removed, err := s.RemoveAllByOwner(context.Background(), conformance.TargetA.Owner)
	require.NoError(t, err)
	require.EqualValues(t, rows, removed)
	spy.mu.Lock()
	defer spy.mu.Unlock()
	for _, prefix := range ownerIndexPrefixes(s, conformance.TargetA.Owner) {
		require.NotContains(t, *spy.ends, clientv3.GetPrefixRangeEnd(prefix), "a counted read of the index to its end")
	}
	require.GreaterOrEqual(t, spy.streams.Load(), int64(4), "3 pages and the final read, streamed")
}
