package etcd

import (
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"

	authority "github.com/zlink-systems/authority"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// DefaultNamespace is the namespace of a Config that names none.
const DefaultNamespace = "/zlink/authority/v1/"

// The layout's top-level segments: the first path segment under the
// namespace of every key the store writes. The key builders below and the
// key parser (inspect.go) both use them.
const (
	segRows           = "rows"
	segOwners         = "owners" // owner liveness keys
	segOwnerGens      = "owner-gens"
	segOwnerRows      = "owner-rows" // owner index
	segCapacity       = "capacity"
	segCapacityEpochs = "capacity-epochs"
	segReservations   = "reservations"
	segTerminals      = "terminals"
	segAggregates     = "aggregates"
	segBlobs          = "blobs"

	// the two kinds of capacity entry under a node lifecycle's range
	capRow = "row"
	capAgg = "agg"
)

// layout builds every key of the store under its namespace.
type layout struct{ ns string }

func esc(s string) string { return url.PathEscape(s) }

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func (l layout) rowsPrefix() string             { return l.ns + segRows + "/" }
func (l layout) row(key authority.Key) string   { return l.ns + segRows + "/" + string(key) }
func (l layout) ownerGen(ownerID string) string { return l.ns + segOwnerGens + "/" + esc(ownerID) }
func (l layout) reservation(id string) string   { return l.ns + segReservations + "/" + esc(id) }
func (l layout) blob(id string) string          { return l.ns + segBlobs + "/" + id }
func (l layout) terminal(op authority.CreationOperation) string {
	return l.ns + segTerminals + "/" + op.Key()
}

// livenessPrefix is the prefix of the liveness keys of one owner lease
// generation.
func (l layout) livenessPrefix(owner authority.OwnerToken) string {
	return l.ns + segOwners + "/" + esc(owner.OwnerID) + "/" + itoa(owner.LeaseGeneration) + "/"
}

func (l layout) liveness(node authority.NodeDescriptor, lifecycle int64, owner authority.OwnerToken) string {
	return l.livenessPrefix(owner) + esc(node.MeshName) + "/" + esc(node.RID) + "/" + itoa(lifecycle)
}

func (l layout) ownerRowsPrefix(owner authority.OwnerToken) string {
	return l.ns + segOwnerRows + "/" + esc(owner.OwnerID) + "/" + itoa(owner.LeaseGeneration) + "/"
}

func (l layout) ownerRow(owner authority.OwnerToken, key authority.Key) string {
	return l.ownerRowsPrefix(owner) + string(key)
}

func (l layout) aggregate(f authority.Fence) string {
	return l.ns + segAggregates + "/" + esc(f.AggregateID) + "/" + itoa(f.AggregateGeneration)
}

// capacityNode is the prefix of every capacity entry of one node lifecycle.
func (l layout) capacityNode(node authority.NodeDescriptor, lifecycle int64) string {
	return l.ns + segCapacity + "/" + esc(node.MeshName) + "/" + esc(node.RID) + "/" + itoa(lifecycle) + "/"
}

// capacityEpoch is the key every Txn that changes a capacity entry of the
// node lifecycle also puts (txn.touch): its ModRevision is the revision of
// the node's last capacity change. It sits outside the capacityNode range.
func (l layout) capacityEpoch(node authority.NodeDescriptor, lifecycle int64) string {
	return l.ns + segCapacityEpochs + "/" + esc(node.MeshName) + "/" + esc(node.RID) + "/" + itoa(lifecycle)
}

// capacityRow is the capacity entry of a row; its state (reserved or
// active) is in the value, so a commit rewrites one key.
func (l layout) capacityRow(a authority.PlacementAllocation, key authority.Key) string {
	return l.capacityNode(a.Descriptor, a.DescriptorLifecycleGeneration) + capRow + "/" + string(key)
}

// capacityAggregate is the capacity entry of a prepared aggregate.
func (l layout) capacityAggregate(a authority.PlacementAllocation, f authority.Fence) string {
	return l.capacityNode(a.Descriptor, a.DescriptorLifecycleGeneration) + capAgg + "/" +
		esc(f.AggregateID) + "/" + itoa(f.AggregateGeneration)
}

// prefixEnd returns the end of the range of keys starting with prefix.
func prefixEnd(prefix string) string { return clientv3.GetPrefixRangeEnd(prefix) }

// layoutSegments are the first path segments of every key a store writes
// under its namespace (the builders above). A namespace with one of them as
// a path segment could lie inside another store's layout: the store on
// "/a/" reads "/a/rows/..." as its rows, so a store on "/a/rows/" would be
// read, listed and overwritten by it. New refuses such namespaces.
var layoutSegments = []string{
	segRows, segOwners, segOwnerGens, segOwnerRows, segCapacity, segCapacityEpochs,
	segReservations, segTerminals, segAggregates, segBlobs,
}

// validateNamespace checks that ns ends in "/", holds no NUL and has no path
// segment that is a layout segment, so no store's namespace lies inside
// another store's layout, whichever prefix the other store has.
func validateNamespace(ns string) error {
	if !strings.HasSuffix(ns, "/") || strings.IndexByte(ns, 0) >= 0 {
		return authority.Invalid("etcd namespace must end in \"/\".")
	}
	for _, seg := range strings.Split(ns, "/") {
		if slices.Contains(layoutSegments, seg) {
			return authority.Invalid(fmt.Sprintf("etcd namespace %q has the path segment %q, which the key layout uses: "+
				"it would lie inside the layout of a store on the namespace before it.", ns, seg))
		}
	}
	return nil
}
