package memory

import (
	"context"

	authority "github.com/zlink-systems/authority"
)

// capacityUsage returns the active and reserved counts of one counter.
func (s *Store) capacityUsage(ctx context.Context, node authority.NodeDescriptor, lifecycleGeneration int64, objectKind authority.ObjectKind, stableType string) (authority.CapacityUsage, error) {
	counter := authority.UsageCounter(node, lifecycleGeneration, objectKind, stableType)
	if _, err := s.lock(ctx); err != nil {
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

// cellShape is what decides the counters of an allocation's capacity
// entries: the node, its lifecycle generation, which counts are non-zero and
// the Spot type.
type cellShape struct {
	node                authority.NodeDescriptor
	lifecycleGeneration int64
	actors, spots       bool
	spotType            bool
	objectKind          authority.ObjectKind
	stableType          string
}

func shapeOf(a *authority.PlacementAllocation) cellShape {
	c := &a.Capacity
	sh := cellShape{
		node: a.Descriptor, lifecycleGeneration: a.DescriptorLifecycleGeneration,
		actors: c.Actors != 0, spots: c.Spots != 0, spotType: c.SpotType != nil,
	}
	if c.SpotType != nil {
		sh.objectKind, sh.stableType = c.SpotType.ObjectKind, c.SpotType.StableType
	}
	return sh
}

// cellCache remembers the cells of the last shape resolved: consecutive
// reservations on one node skip the counter map.
type cellCache struct {
	shape cellShape
	cells [3]*counterCell
	n     int
	valid bool
}

// resolveCells stores the capacity entries of a (in
// authority.CapacityEntries order) with their cells into cells and returns how
// many there are.
func (s *Store) resolveCells(cells *[3]cellEntry, a *authority.PlacementAllocation) int {
	c := &a.Capacity
	sh := shapeOf(a)
	cache := &s.cellCache
	if cache.valid && cache.shape == sh && cellsLive(cache.cells[:cache.n]) {
		n := 0
		if c.Actors != 0 {
			cells[n] = cellEntry{cell: cache.cells[n], count: c.Actors}
			n++
		}
		if c.Spots != 0 {
			cells[n] = cellEntry{cell: cache.cells[n], count: c.Spots}
			n++
		}
		if c.SpotType != nil {
			cells[n] = cellEntry{cell: cache.cells[n], count: c.SpotType.Count}
			n++
		}
		return n
	}
	entries := authority.CapacityEntries(a.Descriptor, a.DescriptorLifecycleGeneration, a.Capacity)
	for i, e := range entries {
		cells[i] = cellEntry{cell: s.cell(e.Counter), count: e.Count}
		cache.cells[i] = cells[i].cell
	}
	cache.shape, cache.n, cache.valid = sh, len(entries), true
	return len(entries)
}

func cellsLive(cells []*counterCell) bool {
	for _, c := range cells {
		if c.dead {
			return false
		}
	}
	return true
}

// cellEntries returns the capacity entries of an allocation with their
// cells.
func (s *Store) cellEntries(a authority.PlacementAllocation) []cellEntry {
	entries := authority.CapacityEntries(a.Descriptor, a.DescriptorLifecycleGeneration, a.Capacity)
	cells := make([]cellEntry, len(entries))
	for i, e := range entries {
		cells[i] = cellEntry{cell: s.cell(e.Counter), count: e.Count}
	}
	return cells
}

// adjust adds sign times the entries' counts to their active or pending
// counts; a cell whose counts are both zero is
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
			// The books no longer balance: a bug, not an input.
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
// next to what its node has reserved and active. Without a policy everything fits.
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
