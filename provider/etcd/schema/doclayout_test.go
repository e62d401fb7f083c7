package schema

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	authority "github.com/zlink-systems/authority"
)

// TestPackageDocKeyLayout keeps the key layout in provider/etcd's package
// doc (../doc.go) equal to the keys this package builds: every layout
// segment has a line there, every line names a layout segment, and every
// key builder's key matches a line (<authority key> and <operation key>
// stand for keys that hold "/", every other <...> for one segment).
func TestPackageDocKeyLayout(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("..", "doc.go"))
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	var patterns []*regexp.Regexp
	documented := map[string]bool{}
	for line := range strings.Lines(string(src)) {
		rest, ok := strings.CutPrefix(line, "//\tns/")
		if !ok {
			continue
		}
		rest, _, _ = strings.Cut(strings.TrimRight(rest, "\n"), "  ") // the description follows two spaces
		path := "ns/" + rest
		lines = append(lines, path)
		seg, _, _ := strings.Cut(rest, "/")
		documented[seg] = true
		re := regexp.QuoteMeta(path)
		re = strings.NewReplacer(`<authority key>`, `.+`, `<operation key>`, `.+`).Replace(re)
		re = regexp.MustCompile(`<[^>]*>`).ReplaceAllString(re, `[^/]+`)
		patterns = append(patterns, regexp.MustCompile(`^`+re+`$`))
	}
	if len(lines) == 0 {
		t.Fatal("doc.go has no key layout lines (\"//\\tns/...\")")
	}
	for _, seg := range layoutSegments {
		if !documented[seg] {
			t.Errorf("layout segment %q has no line in doc.go's key layout", seg)
		}
	}
	for seg := range documented {
		if !slices.Contains(layoutSegments, seg) {
			t.Errorf("doc.go's key layout names %q, which is not a layout segment", seg)
		}
	}
	l := NewLayout("ns/")
	key := authority.Key("user_spot/cart-1")
	node := authority.NodeDescriptor{MeshName: "mesh", RID: "node-1"}
	owner := authority.OwnerToken{OwnerID: "owner-1", LeaseGeneration: 3}
	fence := authority.Fence{AggregateID: "move-1", AggregateGeneration: 2}
	alloc := authority.PlacementAllocation{Descriptor: node, DescriptorLifecycleGeneration: 1}
	op := authority.CreationOperation{SourceNodeRID: "node-1", SourceNodeGeneration: 1, OperationID: authority.CreationOperationID{High: 1, Low: 2}}
	for _, built := range []string{
		l.Row(key), l.Liveness(node, 1, owner), l.OwnerGen("owner-1"), l.OwnerRow(owner, key),
		l.CapacityRow(alloc, key), l.CapacityAggregate(alloc, fence), l.CapacityEpoch(node, 1),
		l.Reservation("r-1"), l.Terminal(op), l.Aggregate(fence), l.Blob("0b2c"),
		l.ActiveVersion(), l.Announcement(0x1234), l.BudgetSlice(node, 1), l.BudgetLedger(node, 1),
		l.RowLock(key), l.AggregatePart(fence),
		l.Placement(alloc, owner, key), l.OwnerNode(owner, node, 1),
	} {
		if !slices.ContainsFunc(patterns, func(p *regexp.Regexp) bool { return p.MatchString(built) }) {
			t.Errorf("key %q matches no line of doc.go's key layout %q", built, lines)
		}
	}
}
