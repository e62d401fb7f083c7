package schema

import (
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"

	authority "github.com/zlink-systems/authority"
)

// The layout's top-level segments: the first path segment under the
// namespace of every key the store writes. The key builders below and the
// key parser (inspect.go) both use them.
const (
	SegRows           = "rows"
	SegOwners         = "owners" // owner liveness keys
	SegOwnerGens      = "owner-gens"
	SegOwnerRows      = "owner-rows" // owner index
	SegCapacity       = "capacity"
	SegCapacityEpochs = "capacity-epochs"
	SegReservations   = "reservations"
	SegTerminals      = "terminals"
	SegAggregates     = "aggregates"
	SegBlobs          = "blobs"

	// the two kinds of capacity entry under a node lifecycle's range
	capRow = "row"
	capAgg = "agg"
)

// Layout builds every key of the store under its namespace.
type Layout struct{ ns string }

func esc(s string) string { return url.PathEscape(s) }

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// RowsPrefix is the prefix of every authority row.
func (l Layout) RowsPrefix() string { return l.ns + SegRows + "/" }

// Row is the key of the authority row of key.
func (l Layout) Row(key authority.Key) string { return l.ns + SegRows + "/" + string(key) }

// OwnerGen is the key holding the last lease generation handed to an owner.
func (l Layout) OwnerGen(ownerID string) string { return l.ns + SegOwnerGens + "/" + esc(ownerID) }

// Reservation is the key of a reservation terminal.
func (l Layout) Reservation(id string) string { return l.ns + SegReservations + "/" + esc(id) }

// Blob is the key of a relocation blob.
func (l Layout) Blob(id string) string { return l.ns + SegBlobs + "/" + id }

// Terminal is the key of a creation terminal.
func (l Layout) Terminal(op authority.CreationOperation) string {
	return l.ns + SegTerminals + "/" + op.Key()
}

// LivenessPrefix is the prefix of the liveness keys of one owner lease
// generation.
func (l Layout) LivenessPrefix(owner authority.OwnerToken) string {
	return l.ns + SegOwners + "/" + esc(owner.OwnerID) + "/" + itoa(owner.LeaseGeneration) + "/"
}

// Liveness is the liveness key of an owner lease generation on a node
// lifecycle (attached to the owner's etcd lease).
func (l Layout) Liveness(node authority.NodeDescriptor, lifecycle int64, owner authority.OwnerToken) string {
	return l.LivenessPrefix(owner) + esc(node.MeshName) + "/" + esc(node.RID) + "/" + itoa(lifecycle)
}

// OwnerRowsPrefix is the prefix of the owner index entries of an owner
// lease generation.
func (l Layout) OwnerRowsPrefix(owner authority.OwnerToken) string {
	return l.ns + SegOwnerRows + "/" + esc(owner.OwnerID) + "/" + itoa(owner.LeaseGeneration) + "/"
}

// OwnerRow is the owner index entry of the row key held by owner.
func (l Layout) OwnerRow(owner authority.OwnerToken, key authority.Key) string {
	return l.OwnerRowsPrefix(owner) + string(key)
}

// Aggregate is the key of an aggregate record.
func (l Layout) Aggregate(f authority.Fence) string {
	return l.ns + SegAggregates + "/" + esc(f.AggregateID) + "/" + itoa(f.AggregateGeneration)
}

// CapacityNode is the prefix of every capacity entry of one node lifecycle.
func (l Layout) CapacityNode(node authority.NodeDescriptor, lifecycle int64) string {
	return l.ns + SegCapacity + "/" + esc(node.MeshName) + "/" + esc(node.RID) + "/" + itoa(lifecycle) + "/"
}

// CapacityEpoch is the key every Txn that changes a capacity entry of the
// node lifecycle also puts (txnkit.Txn.Touch): its ModRevision is the revision of
// the node's last capacity change. It sits outside the capacityNode range.
func (l Layout) CapacityEpoch(node authority.NodeDescriptor, lifecycle int64) string {
	return l.ns + SegCapacityEpochs + "/" + esc(node.MeshName) + "/" + esc(node.RID) + "/" + itoa(lifecycle)
}

// CapacityRow is the capacity entry of a row; its state (reserved or
// active) is in the value, so a commit rewrites one key.
func (l Layout) CapacityRow(a authority.PlacementAllocation, key authority.Key) string {
	return l.CapacityNode(a.Descriptor, a.DescriptorLifecycleGeneration) + capRow + "/" + string(key)
}

// CapacityAggregate is the capacity entry of a prepared aggregate.
func (l Layout) CapacityAggregate(a authority.PlacementAllocation, f authority.Fence) string {
	return l.CapacityNode(a.Descriptor, a.DescriptorLifecycleGeneration) + capAgg + "/" +
		esc(f.AggregateID) + "/" + itoa(f.AggregateGeneration)
}

// layoutSegments are the first path segments of every key a store writes
// under its namespace (the builders above). A namespace with one of them as
// a path segment could lie inside another store's layout: the store on
// "/a/" reads "/a/rows/..." as its rows, so a store on "/a/rows/" would be
// read, listed and overwritten by it. New refuses such namespaces.
var layoutSegments = []string{
	SegRows, SegOwners, SegOwnerGens, SegOwnerRows, SegCapacity, SegCapacityEpochs,
	SegReservations, SegTerminals, SegAggregates, SegBlobs, SegStoreVersion, SegEscrow,
	SegRowLocks, SegAggregateParts, SegShardMap, SegOwnerNodes,
}

// ValidateNamespace checks that ns ends in "/", holds no NUL and has no path
// segment that is a layout segment, so no store's namespace lies inside
// another store's layout, whichever prefix the other store has.
func ValidateNamespace(ns string) error {
	if !strings.HasSuffix(ns, "/") {
		return authority.Invalid(fmt.Sprintf("etcd namespace %q must end in \"/\".", ns))
	}
	if strings.IndexByte(ns, 0) >= 0 {
		return authority.Invalid(fmt.Sprintf("etcd namespace %q must not contain NUL.", ns))
	}
	for _, seg := range strings.Split(ns, "/") {
		if slices.Contains(layoutSegments, seg) {
			return authority.Invalid(fmt.Sprintf("etcd namespace %q has the path segment %q, which the key layout uses: "+
				"it would lie inside the layout of a store on the namespace before it.", ns, seg))
		}
	}
	return nil
}

// NewLayout returns the layout of the keys of a store on namespace (which
// ValidateNamespace accepts).
func NewLayout(namespace string) Layout { return Layout{ns: namespace} }

// Namespace returns the namespace of l's keys.
func (l Layout) Namespace() string { return l.ns }

// Segment returns the layout segment of key (SegRows, SegOwners, …): its
// first path segment under the namespace; "" for a key outside it.
func (l Layout) Segment(key string) string {
	rest, ok := strings.CutPrefix(key, l.ns)
	if !ok {
		return ""
	}
	segment, _, _ := strings.Cut(rest, "/")
	return segment
}
