package etcd

import (
	"net/url"
	"strconv"

	authority "github.com/zlink-systems/authority"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// DefaultNamespace is the namespace of a Config that names none.
const DefaultNamespace = "/zlink/authority/v1/"

// layout builds every key of the store under its namespace.
type layout struct{ ns string }

func esc(s string) string { return url.PathEscape(s) }

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func (l layout) rowsPrefix() string             { return l.ns + "rows/" }
func (l layout) row(key authority.Key) string   { return l.ns + "rows/" + string(key) }
func (l layout) ownerGen(ownerID string) string { return l.ns + "owner-gens/" + esc(ownerID) }
func (l layout) reservation(id string) string   { return l.ns + "reservations/" + esc(id) }
func (l layout) blob(id string) string          { return l.ns + "blobs/" + id }
func (l layout) terminal(op authority.CreationOperation) string {
	return l.ns + "terminals/" + op.Key()
}

// livenessPrefix is the prefix of the liveness keys of one owner lease
// generation.
func (l layout) livenessPrefix(owner authority.OwnerToken) string {
	return l.ns + "owners/" + esc(owner.OwnerID) + "/" + itoa(owner.LeaseGeneration) + "/"
}

func (l layout) liveness(node authority.NodeDescriptor, lifecycle int64, owner authority.OwnerToken) string {
	return l.livenessPrefix(owner) + esc(node.MeshName) + "/" + esc(node.RID) + "/" + itoa(lifecycle)
}

func (l layout) ownerRowsPrefix(owner authority.OwnerToken) string {
	return l.ns + "owner-rows/" + esc(owner.OwnerID) + "/" + itoa(owner.LeaseGeneration) + "/"
}

func (l layout) ownerRow(owner authority.OwnerToken, key authority.Key) string {
	return l.ownerRowsPrefix(owner) + string(key)
}

func (l layout) aggregate(f authority.Fence) string {
	return l.ns + "aggregates/" + esc(f.AggregateID) + "/" + itoa(f.AggregateGeneration)
}

// capacityNode is the prefix of every capacity entry of one node lifecycle.
func (l layout) capacityNode(node authority.NodeDescriptor, lifecycle int64) string {
	return l.ns + "capacity/" + esc(node.MeshName) + "/" + esc(node.RID) + "/" + itoa(lifecycle) + "/"
}

// capacityEpoch is the key every Txn that changes a capacity entry of the
// node lifecycle also puts (txn.touch): its ModRevision is the revision of
// the node's last capacity change. It sits outside the capacityNode range.
func (l layout) capacityEpoch(node authority.NodeDescriptor, lifecycle int64) string {
	return l.ns + "capacity-epochs/" + esc(node.MeshName) + "/" + esc(node.RID) + "/" + itoa(lifecycle)
}

// capacityRow is the capacity entry of a row; its state (reserved or
// active) is in the value, so a commit rewrites one key.
func (l layout) capacityRow(a authority.PlacementAllocation, key authority.Key) string {
	return l.capacityNode(a.Descriptor, a.DescriptorLifecycleGeneration) + "row/" + string(key)
}

// capacityAggregate is the capacity entry of a prepared aggregate.
func (l layout) capacityAggregate(a authority.PlacementAllocation, f authority.Fence) string {
	return l.capacityNode(a.Descriptor, a.DescriptorLifecycleGeneration) + "agg/" +
		esc(f.AggregateID) + "/" + itoa(f.AggregateGeneration)
}

// prefixEnd returns the end of the range of keys starting with prefix.
func prefixEnd(prefix string) string { return clientv3.GetPrefixRangeEnd(prefix) }
