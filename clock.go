package authority

import (
	"sync"
	"time"
)

// ManualClock is a Clock that only moves when told to. It is safe for
// concurrent use; tests inject it to control expiry.
type ManualClock struct {
	mu  sync.Mutex
	now time.Time
}

// NewManualClock returns a clock reading start.
func NewManualClock(start time.Time) *ManualClock { return &ManualClock{now: start} }

// Now returns the clock's time.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock by d: forward, or back for a negative d (as an
// NTP step does).
func (c *ManualClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// MonotonicClock is a Clock that never reads earlier than it read before:
// when the clock it wraps steps back (an NTP step), it keeps answering its
// latest reading until the wrapped clock passes it again. Both providers
// read their Clock through one, so expiry is monotonic: once an operation
// of a store ran at a time a record had expired by, no later operation of
// that store sees the record alive, whatever the wrapped clock does.
type MonotonicClock struct {
	clock Clock
	mu    sync.Mutex
	last  time.Time
}

// NewMonotonicClock returns a MonotonicClock over c (SystemClock when nil);
// c itself when it is one already.
func NewMonotonicClock(c Clock) *MonotonicClock {
	if m, ok := c.(*MonotonicClock); ok {
		return m
	}
	if c == nil {
		c = SystemClock{}
	}
	return &MonotonicClock{clock: c}
}

// Now returns the wrapped clock's time, or the latest time Now returned
// when that is later.
func (c *MonotonicClock) Now() time.Time {
	now := c.clock.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	// on wall time (Round(0) drops a monotonic reading, which would hide a
	// step of the wall clock): stored expiries are wall times
	if now.Round(0).Before(c.last.Round(0)) {
		return c.last
	}
	c.last = now
	return now
}
