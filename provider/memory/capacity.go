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
	return authority.CapacityUsage{Active: s.active[counter], Reserved: s.pending[counter]}, nil
}

// allocationEntries returns the capacity entries of an allocation.
func allocationEntries(a authority.PlacementAllocation) []authority.CapacityEntry {
	return authority.CapacityEntries(a.Descriptor, a.DescriptorLifecycleGeneration, a.Capacity)
}

// adjust adds sign times the capacity entries to counters (the seed's
// adjustCapacity); a counter reaching zero is removed.
func (s *Store) adjust(counters map[authority.CapacityCounter]int64, entries []authority.CapacityEntry, sign int64) {
	for _, e := range entries {
		next := counters[e.Counter] + sign*e.Count
		switch {
		case next < 0:
			// The seed throws here too: the books no longer balance.
			panic("memory: placement capacity counter underflow")
		case next == 0:
			delete(counters, e.Counter)
		default:
			counters[e.Counter] = next
		}
	}
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
		reserved[i] = s.pending[c]
		active[i] = s.active[c]
	}
	n := len(counters)
	return s.policy.PlacementCapacityAvailable(a.Descriptor, a.Capacity.Clone(),
		authority.UsageVector(a.Capacity, reserved[:n]), authority.UsageVector(a.Capacity, active[:n]))
}
