package schema

import (
	"strings"

	authority "github.com/zlink-systems/authority"
)

// The keys of storeversion.FewerKeys: one placement key per row, which is
// both its node lifecycle's capacity entry and its owner's index entry, and
// a directory key per owner lease generation and node lifecycle that holds
// placement keys of it (docs/design-etcd.md, "Fewer keys per row").
//
//	capacity/<esc mesh>/<esc rid>/<lifecycle>/o/<esc owner>/<lease gen>/<authority key>
//	owner-nodes/<esc owner>/<lease gen>/<esc mesh>/<esc rid>/<lifecycle>
//
// A placement key lies in its node lifecycle's capacity range
// (Layout.CapacityNode), next to the capacity entries of rows placed before
// FewerKeys (row/) and of aggregates (agg/), so a node's usage is still the
// sum of one range and its usage watch watches one range. The owner's rows
// on a node lifecycle are the range Layout.PlacementOwnerPrefix, and the
// node lifecycles it holds rows on are its directory keys: every Txn that
// writes a placement key also puts its directory key (a blind put, like a
// capacity epoch), and a directory key is deleted only in a Txn whose
// compare says its placement range is empty.

// SegOwnerNodes is the layout segment of the owner directory keys
// (storeversion.FewerKeys).
const SegOwnerNodes = "owner-nodes"

// capOwned is the capacity range's kind of a row's placement key.
const capOwned = "o"

// PlacementOwnerPrefix is the prefix of the placement keys of the rows
// owner holds on a node lifecycle.
func (l Layout) PlacementOwnerPrefix(node authority.NodeDescriptor, lifecycle int64, owner authority.OwnerToken) string {
	return l.CapacityNode(node, lifecycle) + capOwned + "/" + esc(owner.OwnerID) + "/" + itoa(owner.LeaseGeneration) + "/"
}

// Placement is the placement key of the row key held by owner on a's node
// lifecycle: its capacity entry (the value is the entry's), which also
// indexes it by owner.
func (l Layout) Placement(a authority.PlacementAllocation, owner authority.OwnerToken, key authority.Key) string {
	return l.PlacementOwnerPrefix(a.Descriptor, a.DescriptorLifecycleGeneration, owner) + string(key)
}

// OwnerNodesPrefix is the prefix of the directory keys of one owner lease
// generation.
func (l Layout) OwnerNodesPrefix(owner authority.OwnerToken) string {
	return l.ns + SegOwnerNodes + "/" + esc(owner.OwnerID) + "/" + itoa(owner.LeaseGeneration) + "/"
}

// OwnerNode is the directory key saying that owner may hold placement keys
// on a node lifecycle. Its value is empty.
func (l Layout) OwnerNode(owner authority.OwnerToken, node authority.NodeDescriptor, lifecycle int64) string {
	return l.OwnerNodesPrefix(owner) + esc(node.MeshName) + "/" + esc(node.RID) + "/" + itoa(lifecycle)
}

// ParseOwnerNode returns the node lifecycle a directory key of owner
// (under OwnerNodesPrefix(owner)) names; a key that names none is an error
// wrapping authority.ErrCorrupt.
func (l Layout) ParseOwnerNode(owner authority.OwnerToken, key string) (authority.NodeDescriptor, int64, error) {
	rest, ok := strings.CutPrefix(key, l.OwnerNodesPrefix(owner))
	parts := strings.Split(rest, "/")
	if !ok || len(parts) != 3 {
		return authority.NodeDescriptor{}, 0, corrupt(key, errBadKey)
	}
	node, lifecycle, err := parseNode(parts[0], parts[1], parts[2])
	if err != nil || l.OwnerNode(owner, node, lifecycle) != key {
		return authority.NodeDescriptor{}, 0, corrupt(key, errBadKey)
	}
	return node, lifecycle, nil
}

// decodeOwnerNode decodes owner-nodes/<esc owner>/<lease gen>/<esc mesh>/<esc rid>/<lifecycle>,
// whose value is empty.
func (e *Entry) decodeOwnerNode(rest string, value []byte) error {
	parts := strings.Split(rest, "/")
	if len(parts) != 5 {
		return errBadKey
	}
	var err error
	if e.Owner, err = parseOwner(parts[0], parts[1]); err != nil {
		return err
	}
	if e.Node, e.Lifecycle, err = parseNode(parts[2], parts[3], parts[4]); err != nil {
		return err
	}
	if len(value) != 0 {
		return errBadKey
	}
	return nil
}
