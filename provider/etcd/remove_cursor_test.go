package etcd_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// getRecorder is a KV that records the start key of every Get.
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

// RemoveAllByOwner reads the owner index a page at a time, each page from
// after the last removed row, and removes a page in Txn-sized batches. etcd
// walks a limited range to its end (it counts every key, and the tombstones
// of deleted keys until compaction), so reading one batch at a time, or
// from the owner's prefix every time, made removing an owner quadratic in
// its rows (TestScale: 100k rows at 712 rows/s). Only the first read and
// the final check for rows added behind the cursor start at the prefix.
func TestRemoveAllByOwnerReadsPastRemovedBatches(t *testing.T) {
	c := server.ClientWith(t, func(*clientv3.Config) {})
	rec := &getRecorder{KV: c.KV}
	c.KV = rec
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, c, etcdstore.Config{Clock: clock, MaxTxnOps: 8}) // 2 rows a batch
	etcdstore.SetRemoveIndexPage(t, 5)                                // 3 batches a page, the last one short
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	const rows = 12
	for i := range rows {
		fx.Active(authority.ObjectUserSpot, fmt.Sprintf("rm-%02d", i), conformance.TargetA)
	}
	prefix := schema.Prefix(s.Namespace(), schema.EntryOwnerIndex)
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
	// 12 rows in pages of 5: 3 pages, the empty read after them and the
	// final empty read from the prefix (a read a batch would be 6 + 2)
	require.Len(t, index, 5, "one index read a page: %q", index)
	atPrefix := 0
	for i, k := range index {
		if strings.HasSuffix(k, "/") {
			atPrefix++
			continue
		}
		require.Greater(t, k, index[i-1], "read %d goes back", i)
	}
	require.Equal(t, 2, atPrefix, "index reads starting at the owner's prefix: %q", index)
}
