package memory

import (
	"time"

	authority "github.com/zlink-systems/authority"
)

// row is one authority row. A row value is immutable once it is in the
// store: a write stores a successor, so pinned listings keep seeing the old
// value. The pointers of snap (the Spot type of the capacity, the pending
// creation) point into meta, which the versions of a row share until its
// allocation changes.
type row struct {
	key  authority.Key
	snap authority.Snapshot // StoreNow is unset
	meta *rowMeta
}

// rowMeta is what the versions of a row share.
type rowMeta struct {
	// creation is the reservation the row was created by (the seed's
	// row.creation).
	creation creation
	// cells are the capacity entries of the row's allocation, with their
	// counters resolved; entries() is the used part.
	cells    [3]cellEntry
	n        int
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
	return n
}

// entries returns the row's capacity entries.
func (m *rowMeta) entries() []cellEntry { return m.cells[:m.n] }

// setAllocation gives r a new allocation (and so new shared parts).
func (s *Store) setAllocation(r *row, a authority.PlacementAllocation) {
	m := &rowMeta{creation: r.meta.creation}
	if a.Capacity.SpotType != nil {
		m.spotType = *a.Capacity.SpotType
		a.Capacity.SpotType = &m.spotType
	}
	for _, e := range authority.CapacityEntries(a.Descriptor, a.DescriptorLifecycleGeneration, a.Capacity) {
		m.cells[m.n] = cellEntry{cell: s.cell(e.Counter), count: e.Count}
		m.n++
	}
	r.snap.Allocation = a
	r.meta = m
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
