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

// RemoveAllByOwner reads the owner index from after the last removed page:
// etcd walks the tombstones of deleted keys in a range until compaction, so
// starting every batch at the owner's prefix made removing an owner
// quadratic in its rows (TestScale: 1k rows at 8.7k rows/s, 10k rows at
// 2.9k rows/s). Only the first read and the final check for rows added
// behind the cursor start at the prefix.
//
// And it reads the index in pages that double: etcd answers a range with a
// limit after walking the whole rest of the range to count it, so one index
// read a batch cost each batch every row left (TestScale: 100k rows at 712
// rows/s). 40 rows in batches of 2 take pages of 2, 4, 8, 16 and 32 keys,
// then the empty read past the end and the one from the prefix: 7 reads,
// not the 22 of one read a batch.
func TestRemoveAllByOwnerReadsPastRemovedBatches(t *testing.T) {
	c := server.ClientWith(t, func(*clientv3.Config) {})
	rec := &getRecorder{KV: c.KV}
	c.KV = rec
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, c, etcdstore.Config{Clock: clock, MaxTxnOps: 8}) // 2 rows a batch
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	const rows = 40
	for i := range rows {
		fx.Active(authority.ObjectUserSpot, fmt.Sprintf("rm-%02d", i), conformance.TargetA)
	}
	prefix := etcdstore.Prefix(s.Namespace(), etcdstore.EntryOwnerIndex)
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
	require.Len(t, index, 7, "index reads: pages of 2, 4, 8, 16, 32 keys, past the end, from the prefix: %q", index)
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
