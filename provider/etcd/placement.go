package etcd

import (
	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/provider/etcd/internal/txnkit"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/etcd/storeversion"
)

// Where a row's capacity is held, in either layout (docs/design-etcd.md,
// "Fewer keys per row"). A row placed before storeversion.FewerKeys has a
// capacity entry under its node lifecycle's capacity range and an owner
// index entry; a row placed from FewerKeys on has one placement key under
// that range which names its owner (schema.Row.PlacementKey says which).
// Every operation reads the layout from the row it changes, so rows of both
// layouts are handled by every build from FewerKeys on; a row moved to
// another owner or node lifecycle at FewerKeys takes the new layout.

// fewerKeys reports whether a write built into t writes the forms of
// storeversion.FewerKeys: once the namespace is finalized to it, when t is
// also fenced on the active version (writeFormat), as every compact write
// is.
func (s *Store) fewerKeys(t *txnkit.Txn) bool {
	if !s.atLeast(storeversion.FewerKeys) {
		return false
	}
	s.writeFormat(t)
	return true
}

// placeNew reports whether a row that t places anew, or moves away from
// cur (nil: a new row) to another owner or node lifecycle, gets a placement
// key: at FewerKeys, or when cur has one already (only a namespace
// finalized to FewerKeys holds such a row, so keeping the layout is safe at
// whatever version this store last learned).
func (s *Store) placeNew(t *txnkit.Txn, cur *schema.Row) bool {
	return s.fewerKeys(t) || cur != nil && cur.PlacementKey
}

// capacityKey is the key holding r's capacity entry: its placement key, or
// its capacity entry of the earlier layout.
func (s *Store) capacityKey(r *schema.Row) string {
	if r.PlacementKey {
		return s.keys.Placement(r.Alloc, r.Owner, r.Key)
	}
	return s.keys.CapacityRow(r.Alloc, r.Key)
}

// ownerIndexKey is r's owner index entry: "" for a row with a placement
// key, which is its own index.
func (s *Store) ownerIndexKey(r *schema.Row) string {
	if r.PlacementKey {
		return ""
	}
	return s.keys.OwnerRow(r.Owner, r.Key)
}

// putCapacity writes r's capacity entry (its state and capacity) into t at
// the row's capacity key, touching its node's capacity epoch.
func (s *Store) putCapacity(t *txnkit.Txn, r *schema.Row) {
	t.Put(s.capacityKey(r), s.capacityValue(t, r.Alloc.State, r.Alloc.Capacity))
	s.touchCapacity(t, r.Alloc)
}

// place writes into t where a newly reserved row r is held: its capacity
// entry and its owner index entry, or its placement key and its owner's
// directory key (touched like a capacity epoch: a blind put of an empty
// value).
func (s *Store) place(t *txnkit.Txn, r *schema.Row) {
	s.putCapacity(t, r)
	if r.PlacementKey {
		t.Touch(s.keys.OwnerNode(r.Owner, r.Alloc.Descriptor, r.Alloc.DescriptorLifecycleGeneration))
		return
	}
	t.Put(s.keys.OwnerRow(r.Owner, r.Key), "")
}

// unplace deletes into t the keys holding the row r's capacity and owner
// index, touching its node's capacity epoch.
func (s *Store) unplace(t *txnkit.Txn, r *schema.Row) {
	t.Del(s.capacityKey(r))
	s.touchCapacity(t, r.Alloc)
	if idx := s.ownerIndexKey(r); idx != "" {
		t.Del(idx)
	}
}

// replace writes into t what moving the row cur to next (another owner,
// lease generation, node lifecycle or layout) changes of where it is held:
// the capacity entry moves when its key changes (both nodes' epochs are
// touched), an owner index entry moves when it changes, and a new
// placement key touches its owner's directory key. Nothing is written for
// a key that stays.
func (s *Store) replace(t *txnkit.Txn, cur, next *schema.Row) {
	if oldCap, newCap := s.capacityKey(cur), s.capacityKey(next); oldCap != newCap {
		t.Del(oldCap)
		s.touchCapacity(t, cur.Alloc)
		s.putCapacity(t, next)
		if next.PlacementKey {
			t.Touch(s.keys.OwnerNode(next.Owner, next.Alloc.Descriptor, next.Alloc.DescriptorLifecycleGeneration))
		}
	}
	if oldIdx, newIdx := s.ownerIndexKey(cur), s.ownerIndexKey(next); oldIdx != newIdx {
		if oldIdx != "" {
			t.Del(oldIdx)
		}
		if newIdx != "" {
			t.Put(newIdx, "")
		}
	}
}

// moved returns cur as moved to owner on node lifecycle (node, lifecycle)
// (without its revision), in the layout placeNew gives it.
func (s *Store) moved(t *txnkit.Txn, cur *schema.Row, owner authority.OwnerToken, node authority.NodeDescriptor, lifecycle int64) *schema.Row {
	next := cur.Next(0)
	next.Owner = owner
	next.Alloc = cur.Alloc.Clone()
	next.Alloc.Descriptor, next.Alloc.DescriptorLifecycleGeneration = node, lifecycle
	next.PlacementKey = s.placeNew(t, cur)
	return next
}
