package shardtest

import (
	"sync"

	authority "github.com/zlink-systems/authority"
)

// Claims is a concurrency-safe authority.IdentityClaims; its zero value
// claims nothing.
type Claims struct {
	mu   sync.Mutex
	keys map[authority.Key]bool
}

// IdentityClaimed reports whether key was claimed.
func (c *Claims) IdentityClaimed(key authority.Key) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.keys[key]
}

// Claim claims key.
func (c *Claims) Claim(key authority.Key) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.keys == nil {
		c.keys = map[authority.Key]bool{}
	}
	c.keys[key] = true
}
