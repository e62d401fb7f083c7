package etcd

import (
	"sync"

	"github.com/zlink-systems/authority/provider/etcd/schema"
)

// boundedCache is a map of at most max entries that forgets the oldest
// inserted entry first.
type boundedCache[K comparable, V any] struct {
	mu      sync.Mutex
	max     int
	entries map[K]V
	order   []K // FIFO ring of inserted keys
	next    int
}

func newBoundedCache[K comparable, V any](max int) *boundedCache[K, V] {
	return &boundedCache[K, V]{max: max, entries: make(map[K]V, max), order: make([]K, 0, max)}
}

func (c *boundedCache[K, V]) get(k K) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.entries[k]
	return v, ok
}

// put stores v under k; replace says whether an entry already there is
// replaced or kept.
func (c *boundedCache[K, V]) put(k K, v V, replace bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.entries[k]; ok {
		if replace {
			c.entries[k] = v
		}
		return
	}
	if len(c.order) < c.max {
		c.order = append(c.order, k)
	} else {
		delete(c.entries, c.order[c.next])
		c.order[c.next] = k
		c.next = (c.next + 1) % c.max
	}
	c.entries[k] = v
}

type cacheKey struct {
	key string
	rev int64
}

// rowCache is a bounded cache of decoded rows addressed by (key,
// ModRevision). Such a pair names one immutable row state, so an entry is
// never stale; it only may be missing.
type rowCache struct {
	c *boundedCache[cacheKey, *schema.Row]
}

func newRowCache(max int) *rowCache { return &rowCache{newBoundedCache[cacheKey, *schema.Row](max)} }

func (c *rowCache) get(key string, rev int64) *schema.Row {
	r, _ := c.c.get(cacheKey{key, rev})
	return r
}

func (c *rowCache) put(key string, r *schema.Row) {
	if r == nil || r.ModRev == 0 {
		return
	}
	c.c.put(cacheKey{key, r.ModRev}, r, false)
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
