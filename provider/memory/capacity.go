package memory

import (
	"context"

	authority "github.com/zlink-systems/authority"
)

// CapacityUsage returns the active and reserved counts of one counter (the
// seed's capacityUsage).
func (s *Store) CapacityUsage(ctx context.Context, node authority.NodeDescriptor, lifecycleGeneration int64, objectKind authority.ObjectKind, stableType string) (authority.CapacityUsage, error) {
	counter := authority.UsageCounter(node, lifecycleGeneration, objectKind, stableType)
	if _, err := s.begin(ctx); err != nil {
		return authority.CapacityUsage{}, err
	}
	defer s.mu.Unlock()
	active, reserved := s.usage(counter)
	return authority.CapacityUsage{Active: active, Reserved: reserved}, nil
}

// counterCell holds the counts of one capacity counter. Rows keep pointers
// to their cells, so that moving capacity costs no map lookup.
type counterCell struct {
	counter         authority.CapacityCounter
	active, pending int64
	// dead marks a cell removed from the map once both counts were zero.
	dead bool
}

// cellEntry is a capacity entry: a count against a counter's cell.
type cellEntry struct {
	cell  *counterCell
	count int64
}

// counterState says which count of a cell an adjustment moves.
type counterState uint8

const (
	countActive counterState = iota
	countPending
)

// cell returns the live cell of counter, creating it.
func (s *Store) cell(counter authority.CapacityCounter) *counterCell {
	c := s.counters[counter]
	if c == nil {
		c = &counterCell{counter: counter}
		s.counters[counter] = c
	}
	return c
}

// cellEntries returns the capacity entries of an allocation (the seed's
// capacityEntries) with their cells.
func (s *Store) cellEntries(a authority.PlacementAllocation) []cellEntry {
	entries := authority.CapacityEntries(a.Descriptor, a.DescriptorLifecycleGeneration, a.Capacity)
	cells := make([]cellEntry, len(entries))
	for i, e := range entries {
		cells[i] = cellEntry{cell: s.cell(e.Counter), count: e.Count}
	}
	return cells
}

// adjust adds sign times the entries' counts to their active or pending
// counts (the seed's adjustCapacity); a cell whose counts are both zero is
// removed.
func (s *Store) adjust(state counterState, entries []cellEntry, sign int64) {
	for i := range entries {
		e := &entries[i]
		c := e.cell
		if c.dead {
			c = s.cell(c.counter)
		}
		n := &c.active
		if state == countPending {
			n = &c.pending
		}
		*n += sign * e.count
		switch {
		case *n < 0:
			// The seed throws here too: the books no longer balance.
			panic("memory: placement capacity counter underflow")
		case c.active == 0 && c.pending == 0:
			c.dead = true
			delete(s.counters, c.counter)
		}
	}
}

// usage returns the active and reserved counts of counter.
func (s *Store) usage(counter authority.CapacityCounter) (active, reserved int64) {
	if c := s.counters[counter]; c != nil {
		return c.active, c.pending
	}
	return 0, 0
}

// hasPendingCapacity asks the capacity policy whether the allocation fits
// next to what its node has reserved and active (the seed's
// hasPendingCapacity). Without a policy everything fits.
func (s *Store) hasPendingCapacity(a *authority.PlacementAllocation) bool {
	if s.policy == nil {
		return true
	}
	counters := authority.UsageCounters(a.Descriptor, a.DescriptorLifecycleGeneration, a.Capacity)
	var reserved, active [3]int64
	for i, c := range counters {
		active[i], reserved[i] = s.usage(c)
	}
	n := len(counters)
	return s.policy.PlacementCapacityAvailable(a.Descriptor, a.Capacity.Clone(),
		authority.UsageVector(a.Capacity, reserved[:n]), authority.UsageVector(a.Capacity, active[:n]))
}
