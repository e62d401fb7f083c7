package etcd

import "sync"

type cacheKey struct {
	key string
	rev int64
}

// rowCache is a bounded cache of decoded rows addressed by (key,
// ModRevision). Such a pair names one immutable row state, so an entry is
// never stale; it only may be missing.
type rowCache struct {
	mu    sync.Mutex
	max   int
	rows  map[cacheKey]*row
	order []cacheKey // FIFO ring of inserted keys
	next  int
}

func newRowCache(max int) *rowCache {
	return &rowCache{max: max, rows: make(map[cacheKey]*row, max), order: make([]cacheKey, 0, max)}
}

func (c *rowCache) get(key string, rev int64) *row {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rows[cacheKey{key, rev}]
}

func (c *rowCache) put(key string, r *row) {
	if r == nil || r.modRev == 0 {
		return
	}
	k := cacheKey{key, r.modRev}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.rows[k]; ok {
		return
	}
	if len(c.order) < c.max {
		c.order = append(c.order, k)
	} else {
		delete(c.rows, c.order[c.next])
		c.order[c.next] = k
		c.next = (c.next + 1) % c.max
	}
	c.rows[k] = r
}
