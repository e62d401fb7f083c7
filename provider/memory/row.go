package memory

import (
	"time"

	authority "github.com/zlink-systems/authority"
)

// row is one authority row. A row value is immutable once it is in the
// store: a write stores a successor, so pinned listings keep seeing the old
// value. The pointers of snap (the Spot type of the capacity, the pending
// creation) point into the row itself, so a row is one allocation.
type row struct {
	key  authority.Key
	snap authority.Snapshot // StoreNow is unset
	// creation is the reservation the row was created by (the seed's
	// row.creation).
	creation creation
	// entries are the capacity entries of snap.Allocation, computed once.
	entries []authority.CapacityEntry

	spotType authority.SpotTypeCapacity
	pending  authority.PendingCreation
}

// creation is the reservation a row was made by.
type creation struct {
	reservationID string
	target        authority.CreationTarget
}

func rowLess(a, b *row) bool { return a.key < b.key }

// successor returns a copy of r for the next version of the row.
func (r *row) successor() *row {
	n := new(row)
	*n = *r
	n.rebase()
	return n
}

// rebase points snap's pointers at the row's own fields.
func (r *row) rebase() {
	if st := r.snap.Allocation.Capacity.SpotType; st != nil {
		r.spotType = *st
		r.snap.Allocation.Capacity.SpotType = &r.spotType
	}
	if p := r.snap.PendingCreation; p != nil {
		r.pending = *p
		r.snap.PendingCreation = &r.pending
	}
}

// setAllocation sets the row's allocation and its capacity entries.
func (r *row) setAllocation(a authority.PlacementAllocation) {
	r.snap.Allocation = a
	r.rebase()
	r.entries = authority.CapacityEntries(a.Descriptor, a.DescriptorLifecycleGeneration, a.Capacity)
}

// exported is a caller-owned snapshot with its pointed-to parts, allocated
// together.
type exported struct {
	snap     authority.Snapshot
	spotType authority.SpotTypeCapacity
	pending  authority.PendingCreation
}

// exportSize is how many bytes of payload and digest a snapshot copy needs.
func (r *row) exportSize() int {
	n := len(r.snap.Payload)
	if p := r.snap.PendingCreation; p != nil {
		n += len(p.RequestSHA256)
	}
	return n
}

// exportInto copies the row's snapshot into x, its bytes into buf (of
// exportSize bytes), stamped with now.
func (r *row) exportInto(x *exported, buf []byte, now time.Time) {
	x.snap = r.snap
	x.snap.StoreNow = now
	if st := r.snap.Allocation.Capacity.SpotType; st != nil {
		x.spotType = *st
		x.snap.Allocation.Capacity.SpotType = &x.spotType
	}
	if r.snap.Payload != nil {
		n := copy(buf, r.snap.Payload)
		x.snap.Payload, buf = buf[:n:n], buf[n:]
	}
	if p := r.snap.PendingCreation; p != nil {
		x.pending = *p
		n := copy(buf, p.RequestSHA256)
		x.pending.RequestSHA256 = buf[:n:n]
		x.snap.PendingCreation = &x.pending
	}
}

// snapshot returns a caller-owned copy of the row's snapshot.
func (r *row) snapshot(now time.Time) *authority.Snapshot {
	x := new(exported)
	r.exportInto(x, make([]byte, r.exportSize()), now)
	return &x.snap
}
