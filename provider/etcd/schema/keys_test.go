package schema

import (
	"slices"
	"strings"
	"testing"

	authority "github.com/zlink-systems/authority"
)

// Every key the layout builds starts with a segment of layoutSegments, so
// validateNamespace's rule covers the whole layout (a new kind of key must be
// added there).
func TestLayoutSegmentsCoverEveryKey(t *testing.T) {
	l := Layout{ns: "/ns/"}
	node := authority.NodeDescriptor{MeshName: "m", RID: "r"}
	owner := authority.OwnerToken{OwnerID: "o", LeaseGeneration: 1}
	fence := authority.Fence{AggregateID: "a", AggregateGeneration: 1}
	alloc := authority.PlacementAllocation{Descriptor: node, DescriptorLifecycleGeneration: 1}
	keys := []string{
		l.RowsPrefix(), l.Row("actor/x"), l.OwnerGen("o"), l.Reservation("r"), l.Blob("b"),
		l.Terminal(authority.CreationOperation{SourceNodeRID: "s", SourceNodeGeneration: 1}),
		l.LivenessPrefix(owner), l.Liveness(node, 1, owner), l.OwnerRowsPrefix(owner), l.OwnerRow(owner, "actor/x"),
		l.Aggregate(fence), l.CapacityNode(node, 1), l.CapacityEpoch(node, 1), l.CapacityRow(alloc, "actor/x"),
		l.CapacityAggregate(alloc, fence), l.BudgetSlice(node, 1), l.BudgetLedger(node, 1),
	}
	for _, k := range keys {
		first, _, _ := strings.Cut(strings.TrimPrefix(k, l.ns), "/")
		if !slices.Contains(layoutSegments, first) {
			t.Errorf("key %q starts with %q, not a layout segment", k, first)
		}
	}
	if err := ValidateNamespace("/zlink/authority/v1/"); err != nil { // the provider's DefaultNamespace
		t.Errorf("the default namespace is refused: %v", err)
	}
}
