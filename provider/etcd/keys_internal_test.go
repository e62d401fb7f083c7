package etcd

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
	l := layout{ns: "/ns/"}
	node := authority.NodeDescriptor{MeshName: "m", RID: "r"}
	owner := authority.OwnerToken{OwnerID: "o", LeaseGeneration: 1}
	fence := authority.Fence{AggregateID: "a", AggregateGeneration: 1}
	alloc := authority.PlacementAllocation{Descriptor: node, DescriptorLifecycleGeneration: 1}
	keys := []string{
		l.rowsPrefix(), l.row("actor/x"), l.ownerGen("o"), l.reservation("r"), l.blob("b"),
		l.terminal(authority.CreationOperation{SourceNodeRID: "s", SourceNodeGeneration: 1}),
		l.livenessPrefix(owner), l.liveness(node, 1, owner), l.ownerRowsPrefix(owner), l.ownerRow(owner, "actor/x"),
		l.aggregate(fence), l.capacityNode(node, 1), l.capacityEpoch(node, 1), l.capacityRow(alloc, "actor/x"),
		l.capacityAggregate(alloc, fence),
	}
	for _, k := range keys {
		first, _, _ := strings.Cut(strings.TrimPrefix(k, l.ns), "/")
		if !slices.Contains(layoutSegments, first) {
			t.Errorf("key %q starts with %q, not a layout segment", k, first)
		}
	}
	if err := validateNamespace(DefaultNamespace); err != nil {
		t.Errorf("the default namespace is refused: %v", err)
	}
}
