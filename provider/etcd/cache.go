package etcd

import (
	"github.com/zlink-systems/authority/provider/etcd/internal/txnkit"
	"github.com/zlink-systems/authority/provider/etcd/schema"
)

type cacheKey struct {
	key string
	rev int64
}

// rowCache is a bounded cache of decoded rows addressed by (key,
// ModRevision). Such a pair names one immutable row state, so an entry is
// never stale; it only may be missing.
type rowCache struct {
	c *txnkit.BoundedCache[cacheKey, *schema.Row]
}

func newRowCache(max int) *rowCache {
	return &rowCache{txnkit.NewBoundedCache[cacheKey, *schema.Row](max)}
}

func (c *rowCache) get(key string, rev int64) *schema.Row {
	r, _ := c.c.Get(cacheKey{key, rev})
	return r
}

func (c *rowCache) put(key string, r *schema.Row) {
	if r == nil || r.ModRev == 0 {
		return
	}
	c.c.Put(cacheKey{key, r.ModRev}, r, false)
}

// knownAggregate is the last state of an aggregate record this store wrote
// or read: the record and its ModRevision. A prepared one may be stale
// (another store may have committed or aborted it), so it is only used under
// a compare of that ModRevision; committed and aborted records never change
// until they expire (loadAggregate checks the expiry on every use).
type knownAggregate struct {
	rec *schema.AggregateRecord
	rev int64
}
