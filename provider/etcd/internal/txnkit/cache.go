package txnkit

import "sync"

// BoundedCache is a map of at most a fixed number of entries that forgets
// the oldest inserted entry first; safe for concurrent use. Make it with
// NewBoundedCache.
type BoundedCache[K comparable, V any] struct {
	mu      sync.Mutex
	max     int
	entries map[K]V
	order   []K // FIFO ring of inserted keys
	next    int
}

// NewBoundedCache returns an empty cache of at most max entries.
func NewBoundedCache[K comparable, V any](max int) *BoundedCache[K, V] {
	return &BoundedCache[K, V]{max: max, entries: make(map[K]V, max), order: make([]K, 0, max)}
}

// Get returns the entry under k.
func (c *BoundedCache[K, V]) Get(k K) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.entries[k]
	return v, ok
}

// Put stores v under k; replace says whether an entry already there is
// replaced or kept.
func (c *BoundedCache[K, V]) Put(k K, v V, replace bool) {
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
