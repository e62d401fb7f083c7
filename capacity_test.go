package authority_test

import (
	"reflect"
	"testing"

	authority "github.com/zlink-systems/authority"
)

var node = authority.NodeDescriptor{MeshName: "mesh", RID: "node-1"}

func counter(kind authority.ObjectKind, stableType string) authority.CapacityCounter {
	return authority.CapacityCounter{Node: node, LifecycleGeneration: 3, ObjectKind: kind, StableType: stableType}
}

func TestCapacityEntries(t *testing.T) {
	cases := []struct {
		name string
		c    authority.CapacityVector
		want []authority.CapacityEntry
	}{
		{"empty", authority.CapacityVector{}, []authority.CapacityEntry{}},
		{"actors", authority.CapacityVector{Actors: 2}, []authority.CapacityEntry{{Counter: counter(authority.ObjectActor, ""), Count: 2}}},
		{"spots", authority.CapacityVector{Spots: 4}, []authority.CapacityEntry{{Counter: counter(authority.CounterSpots, ""), Count: 4}}},
		{"all in seed order", authority.CapacityVector{Actors: 1, Spots: 2, SpotType: spotType(3)}, []authority.CapacityEntry{
			{Counter: counter(authority.ObjectActor, ""), Count: 1},
			{Counter: counter(authority.CounterSpots, ""), Count: 2},
			{Counter: counter(authority.ObjectUserSpot, "chat"), Count: 3},
		}},
		{"spot type only", authority.CapacityVector{SpotType: &authority.SpotTypeCapacity{ObjectKind: authority.ObjectInstanceSpot, StableType: "i", Count: 7}},
			[]authority.CapacityEntry{{Counter: counter(authority.ObjectInstanceSpot, "i"), Count: 7}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := authority.CapacityEntries(node, 3, c.c)
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("CapacityEntries = %+v, want %+v", got, c.want)
			}
			alloc := authority.PlacementAllocation{State: authority.AllocationActive, Descriptor: node, DescriptorLifecycleGeneration: 3, Capacity: c.c}
			if got := alloc.Entries(); !reflect.DeepEqual(got, c.want) {
				t.Errorf("PlacementAllocation.Entries = %+v, want %+v", got, c.want)
			}
		})
	}
}

func TestUsageCountersAndVector(t *testing.T) {
	plain := authority.CapacityVector{Actors: 1}
	got := authority.UsageCounters(node, 3, plain)
	want := []authority.CapacityCounter{counter(authority.ObjectActor, ""), counter(authority.CounterSpots, "")}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("UsageCounters(no spot type) = %+v", got)
	}
	if v := authority.UsageVector(plain, []int64{5, 6}); !v.Equal(authority.CapacityVector{Actors: 5, Spots: 6}) {
		t.Errorf("UsageVector(no spot type) = %+v", v)
	}

	typed := authority.CapacityVector{Spots: 1, SpotType: spotType(1)}
	got = authority.UsageCounters(node, 3, typed)
	want = append(want, counter(authority.ObjectUserSpot, "chat"))
	if !reflect.DeepEqual(got, want) {
		t.Errorf("UsageCounters(spot type) = %+v", got)
	}
	v := authority.UsageVector(typed, []int64{5, 6, 7})
	if !v.Equal(authority.CapacityVector{Actors: 5, Spots: 6, SpotType: spotType(7)}) {
		t.Errorf("UsageVector(spot type) = %+v", v)
	}
	if v.SpotType == typed.SpotType || typed.SpotType.Count != 1 {
		t.Error("UsageVector shares or changes the requested Spot type")
	}
}

func TestUsageCounter(t *testing.T) {
	cases := []struct {
		kind       authority.ObjectKind
		stableType string
		want       authority.CapacityCounter
	}{
		{authority.ObjectActor, "ignored", counter(authority.ObjectActor, "")},
		{authority.ObjectUserSpot, "chat", counter(authority.ObjectUserSpot, "chat")},
		{authority.ObjectInstanceSpot, "", counter(authority.ObjectInstanceSpot, "")},
		{authority.CounterSpots, "ignored", counter(authority.CounterSpots, "")},
		{"anything", "x", counter(authority.CounterSpots, "")},
	}
	for _, c := range cases {
		if got := authority.UsageCounter(node, 3, c.kind, c.stableType); got != c.want {
			t.Errorf("UsageCounter(%q, %q) = %+v, want %+v", c.kind, c.stableType, got, c.want)
		}
	}
}

func TestAddCapacity(t *testing.T) {
	other := &authority.SpotTypeCapacity{ObjectKind: authority.ObjectUserSpot, StableType: "other", Count: 1}
	otherKind := &authority.SpotTypeCapacity{ObjectKind: authority.ObjectInstanceSpot, StableType: "chat", Count: 1}
	cases := []struct {
		name        string
		left, right authority.CapacityVector
		want        authority.CapacityVector
		err         bool
	}{
		{"zero", authority.CapacityVector{}, authority.CapacityVector{}, authority.CapacityVector{}, false},
		{"counts", authority.CapacityVector{Actors: 1, Spots: 2}, authority.CapacityVector{Actors: 3, Spots: 4}, authority.CapacityVector{Actors: 4, Spots: 6}, false},
		{"left type", authority.CapacityVector{SpotType: spotType(2)}, authority.CapacityVector{Actors: 1}, authority.CapacityVector{Actors: 1, SpotType: spotType(2)}, false},
		{"right type", authority.CapacityVector{Actors: 1}, authority.CapacityVector{SpotType: spotType(2)}, authority.CapacityVector{Actors: 1, SpotType: spotType(2)}, false},
		{"same type", authority.CapacityVector{Spots: 1, SpotType: spotType(2)}, authority.CapacityVector{Spots: 1, SpotType: spotType(3)}, authority.CapacityVector{Spots: 2, SpotType: spotType(5)}, false},
		{"other stable type", authority.CapacityVector{SpotType: spotType(1)}, authority.CapacityVector{SpotType: other}, authority.CapacityVector{}, true},
		{"other kind", authority.CapacityVector{SpotType: spotType(1)}, authority.CapacityVector{SpotType: otherKind}, authority.CapacityVector{}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			leftBefore, rightBefore := c.left.Clone(), c.right.Clone()
			got, err := authority.AddCapacity(c.left, c.right)
			if c.err {
				checkInvalid(t, err, "Aggregate capacity contains more than one Spot type.")
				if !got.Equal(authority.CapacityVector{}) {
					t.Errorf("AddCapacity returned %+v with an error", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !got.Equal(c.want) {
				t.Errorf("AddCapacity = %+v, want %+v", got, c.want)
			}
			if !c.left.Equal(leftBefore) || !c.right.Equal(rightBefore) {
				t.Error("AddCapacity changed its inputs")
			}
			if got.SpotType != nil && (got.SpotType == c.left.SpotType || got.SpotType == c.right.SpotType) {
				t.Error("AddCapacity result shares a Spot type with an input")
			}
		})
	}
}
