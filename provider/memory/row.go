package memory

import (
	"bytes"
	"strconv"
	"time"
	"unsafe"

	authority "github.com/zlink-systems/authority"
)

// row is one authority row. A row value that a pinned listing can see, or
// that a listing is copying outside the lock, is immutable: a write stores a
// successor, so the listing keeps seeing the old value. Any other row value
// is rewritten in place (Store.writable), which saves an allocation per write.
// The pointers of snap (the Spot type of the capacity, the pending creation)
// point into meta, which the versions of a row share until its allocation
// changes.
type row struct {
	key authority.Key
	// snap is the row's state. Its StoreVersion and StoreNow are unset:
	// export writes them (the version from version).
	snap authority.Snapshot
	// version is the row's store version (the decimal text of the
	// snapshot's StoreVersion).
	version int64
	// born is the store revision at which this value was written.
	born int64
	meta *rowMeta
}

// rowMeta is what the versions of a row share. spotType comes first: in a
// reservationBlock it then shares cache lines with the row, which a listing
// reads.
type rowMeta struct {
	spotType authority.SpotTypeCapacity
	// cells are the capacity entries of the row's allocation, with their
	// counters resolved; entries() is the used part.
	cells [3]cellEntry
	n     int
	// reservation is the reservation the row was created by, while the row
	// is reserved; nil once it is active.
	reservation *reservationPart
}

// reservationPart is what a reserved row holds beyond an active one, in one
// allocation that is garbage once the row is committed: the reservation, the
// pending creation and, when the request digest
// fits, its bytes.
type reservationPart struct {
	creation creation
	pending  authority.PendingCreation
	idText   [uuidTextLen]byte
	digest   [partDigestBytes]byte
}

// creation is the reservation a row was made by.
type creation struct {
	// seq is the reservation's number (reservations.go); reservationID
	// is its ID's text.
	seq           uint64
	reservationID string
	target        authority.CreationTarget
}

// rowBlock is what Reserve allocates for a new row next to its
// reservationPart: the row, its shared parts and, when it fits, the payload,
// in one allocation. The parts a listing reads (the row, its payload, its
// Spot type) are adjacent.
type rowBlock struct {
	row    row
	inline [blockInlineBytes]byte
	meta   rowMeta
}

// The inline sizes fill rowBlock (416 bytes) and reservationPart (224 bytes)
// to their allocation size classes.
const (
	blockInlineBytes = 40
	partDigestBytes  = 36
)

func rowLess(a, b *row) bool { return a.key < b.key }

// successor returns a copy of r for the next version of the row.
func (r *row) successor() *row {
	n := new(row)
	*n = *r
	return n
}

// versionIs reports whether v is the row's store version: its decimal text,
// without sign or leading zeros.
func (r *row) versionIs(v authority.StoreVersion) bool {
	if len(v) == 0 || len(v) > 18 || len(v) > 1 && v[0] == '0' {
		// 18 digits cannot overflow; longer text is compared as text.
		var buf [20]byte
		return len(v) > 18 && string(strconv.AppendInt(buf[:0], r.version, 10)) == string(v)
	}
	var n int64
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < '0' || c > '9' {
			return false
		}
		n = n*10 + int64(c-'0')
	}
	return n == r.version
}

// entries returns the row's capacity entries.
func (m *rowMeta) entries() []cellEntry { return m.cells[:m.n] }

// setAllocation gives r a new allocation (and so new shared parts).
func (s *Store) setAllocation(r *row, a authority.PlacementAllocation) {
	m := &rowMeta{reservation: r.meta.reservation}
	s.initAllocation(r, m, a)
}

// initAllocation makes m r's shared parts and a its allocation.
func (s *Store) initAllocation(r *row, m *rowMeta, a authority.PlacementAllocation) {
	if a.Capacity.SpotType != nil {
		m.spotType = *a.Capacity.SpotType
		a.Capacity.SpotType = &m.spotType
	}
	m.n = s.resolveCells(&m.cells, &a)
	r.snap.Allocation = a
	r.meta = m
}

// payloadCopy returns a copy of p to store as the payload of a row whose
// previous payload was old. When the row is rewritten in place (inPlace),
// old's buffer is the row's own and is reused if p fits it without holding
// on to much more than p needs.
func payloadCopy(old, p []byte, inPlace bool) []byte {
	if p == nil {
		return nil
	}
	if inPlace && old != nil && cap(old) >= len(p) && cap(old) <= 2*len(p)+128 {
		old = old[:len(p)]
		copy(old, p)
		return old
	}
	return bytes.Clone(p)
}

// exported is a caller-owned snapshot with its pointed-to parts.
type exported struct {
	snap     authority.Snapshot
	spotType authority.SpotTypeCapacity
	pending  authority.PendingCreation
}

// exportedActive is a caller-owned snapshot without a pending creation and
// with room for its bytes, in one allocation.
type exportedActive struct {
	snap     authority.Snapshot
	spotType authority.SpotTypeCapacity
	text     [activeInlineBytes]byte
}

// exportedPending is exported with room for its bytes, in one allocation.
type exportedPending struct {
	exported
	text [pendingInlineBytes]byte
}

// The inline sizes fill the allocation size classes of exportedActive (320
// bytes) and exportedPending (416 bytes).
const (
	activeInlineBytes  = 48
	pendingInlineBytes = 80
)

// exportSize is how many bytes of text (version, reservation ID, payload,
// digest) a snapshot copy needs.
func (r *row) exportSize() int {
	n := decimalLen(r.version) + len(r.snap.Payload)
	if p := r.snap.PendingCreation; p != nil {
		n += len(p.RequestSHA256)
	}
	return n
}

// decimalLen is the length of strconv.FormatInt(v, 10) for v ≥ 0.
func decimalLen(v int64) int {
	n := 1
	for v >= 10 {
		v /= 10
		n++
	}
	return n
}

// exportInto copies the row's snapshot into x, stamped with now, its Spot
// type into st and its pending creation into pc (each needed only when the
// row has one), and its bytes into buf (of exportSize bytes). The version
// text shares buf: the caller owns the payload and digest slices, which are
// capped so that the version's bytes stay out of their reach.
func (r *row) exportInto(x *authority.Snapshot, st *authority.SpotTypeCapacity, pc *authority.PendingCreation, buf []byte, now time.Time) {
	*x = r.snap
	x.StoreNow = now
	v := strconv.AppendInt(buf[:0], r.version, 10)
	// The digits are written once, here, and never again: a string can
	// share them.
	x.StoreVersion = authority.StoreVersion(unsafe.String(unsafe.SliceData(v), len(v)))
	buf = buf[len(v):]
	if s := r.snap.Allocation.Capacity.SpotType; s != nil {
		*st = *s
		x.Allocation.Capacity.SpotType = st
	}
	if r.snap.Payload != nil {
		n := copy(buf, r.snap.Payload)
		x.Payload, buf = buf[:n:n], buf[n:]
	}
	if p := r.snap.PendingCreation; p != nil {
		*pc = *p
		n := copy(buf, p.RequestSHA256)
		pc.RequestSHA256 = buf[:n:n]
		x.PendingCreation = pc
	}
}

// maxVersionDigits is the length of the longest store version's text
// (authority.MaxGeneration).
const maxVersionDigits = 19

// exportRoom is the memory of a snapshot copy, allocated before the store's
// lock is taken, so that the allocation (and the collector's work it may
// bring) stays out of the critical section. At most one field is set.
type exportRoom struct {
	active  *exportedActive
	pending *exportedPending
}

// roomFor returns room for the copy of a row with (pending) or without a
// pending creation whose payload and digest take n bytes. The room is empty
// when they may not fit inline.
func roomFor(pending bool, n int) exportRoom {
	switch size := maxVersionDigits + n; {
	case !pending && size <= activeInlineBytes:
		return exportRoom{active: new(exportedActive)}
	case size <= pendingInlineBytes:
		return exportRoom{pending: new(exportedPending)}
	}
	return exportRoom{}
}

// snapshot returns a caller-owned copy of the row's snapshot, in one
// allocation when its bytes are small.
func (r *row) snapshot(now time.Time) *authority.Snapshot {
	return r.snapshotIn(roomFor(r.snap.PendingCreation != nil, r.exportSize()-maxVersionDigits), now)
}

// snapshotIn is snapshot written into room when the copy fits it.
func (r *row) snapshotIn(room exportRoom, now time.Time) *authority.Snapshot {
	size := r.exportSize()
	switch {
	case room.active != nil && r.snap.PendingCreation == nil && size <= activeInlineBytes:
		x := room.active
		r.exportInto(&x.snap, &x.spotType, nil, x.text[:size:size], now)
		return &x.snap
	case room.pending != nil && size <= pendingInlineBytes:
		x := room.pending
		r.exportInto(&x.snap, &x.spotType, &x.pending, x.text[:size:size], now)
		return &x.snap
	}
	x := new(exported)
	r.exportInto(&x.snap, &x.spotType, &x.pending, make([]byte, size), now)
	return &x.snap
}
