package authority

// CounterSpots is the pseudo object kind of a node's total Spot counter.
const CounterSpots ObjectKind = "spot"

// CapacityCounter names one capacity counter of a node: the actor counter
// (ObjectActor, no stable type), the total Spot counter (CounterSpots, no
// stable type), or a per-type counter (a Spot kind and its stable type).
type CapacityCounter struct {
	Node                NodeDescriptor
	LifecycleGeneration int64
	ObjectKind          ObjectKind
	StableType          string
}

// CapacityEntry is a count against one counter.
type CapacityEntry struct {
	Counter CapacityCounter
	Count   int64
}

// CapacityEntries returns the non-zero counts of c on a node, in this
// order: actors, spots, spot type.
func CapacityEntries(node NodeDescriptor, lifecycleGeneration int64, c CapacityVector) []CapacityEntry {
	entries := make([]CapacityEntry, 0, 3)
	counter := func(kind ObjectKind, stableType string) CapacityCounter {
		return CapacityCounter{Node: node, LifecycleGeneration: lifecycleGeneration, ObjectKind: kind, StableType: stableType}
	}
	if c.Actors != 0 {
		entries = append(entries, CapacityEntry{Counter: counter(ObjectActor, ""), Count: c.Actors})
	}
	if c.Spots != 0 {
		entries = append(entries, CapacityEntry{Counter: counter(CounterSpots, ""), Count: c.Spots})
	}
	if c.SpotType != nil {
		entries = append(entries, CapacityEntry{Counter: counter(c.SpotType.ObjectKind, c.SpotType.StableType), Count: c.SpotType.Count})
	}
	return entries
}

// Entries returns the capacity entries of the allocation.
func (a PlacementAllocation) Entries() []CapacityEntry {
	return CapacityEntries(a.Descriptor, a.DescriptorLifecycleGeneration, a.Capacity)
}

// UsageCounters returns the counters a capacity policy sees for a request on
// a node: actors, spots and, if requested has one, its Spot type.
func UsageCounters(node NodeDescriptor, lifecycleGeneration int64, requested CapacityVector) []CapacityCounter {
	counters := []CapacityCounter{
		{Node: node, LifecycleGeneration: lifecycleGeneration, ObjectKind: ObjectActor},
		{Node: node, LifecycleGeneration: lifecycleGeneration, ObjectKind: CounterSpots},
	}
	if requested.SpotType != nil {
		counters = append(counters, CapacityCounter{
			Node: node, LifecycleGeneration: lifecycleGeneration,
			ObjectKind: requested.SpotType.ObjectKind, StableType: requested.SpotType.StableType,
		})
	}
	return counters
}

// UsageVector builds the vector a capacity policy sees from the counts of
// UsageCounters: counts[i] belongs to
// UsageCounters(...)[i].
func UsageVector(requested CapacityVector, counts []int64) CapacityVector {
	v := CapacityVector{Actors: counts[0], Spots: counts[1]}
	if requested.SpotType != nil {
		st := *requested.SpotType
		st.Count = counts[2]
		v.SpotType = &st
	}
	return v
}

// UsageCounter returns the counter CapacityUsage reports for an object kind
// and stable type: the actor counter for ObjectActor, the per-type counter for
// a Spot kind, the total Spot counter otherwise.
func UsageCounter(node NodeDescriptor, lifecycleGeneration int64, objectKind ObjectKind, stableType string) CapacityCounter {
	c := CapacityCounter{Node: node, LifecycleGeneration: lifecycleGeneration}
	switch {
	case objectKind == ObjectActor:
		c.ObjectKind = ObjectActor
	case objectKind.IsSpot():
		c.ObjectKind, c.StableType = objectKind, stableType
	default:
		c.ObjectKind = CounterSpots
	}
	return c
}

// AddCapacity adds two vectors. Adding vectors of two different Spot types is
// invalid.
func AddCapacity(left, right CapacityVector) (CapacityVector, error) {
	sum := CapacityVector{Actors: left.Actors + right.Actors, Spots: left.Spots + right.Spots}
	if left.SpotType != nil {
		st := *left.SpotType
		sum.SpotType = &st
	}
	if right.SpotType != nil {
		if sum.SpotType != nil && (sum.SpotType.ObjectKind != right.SpotType.ObjectKind ||
			sum.SpotType.StableType != right.SpotType.StableType) {
			return CapacityVector{}, Invalid("Aggregate capacity contains more than one Spot type.")
		}
		st := *right.SpotType
		if sum.SpotType != nil {
			st.Count += sum.SpotType.Count
		}
		sum.SpotType = &st
	}
	return sum, nil
}
