package memory

import (
	"encoding/binary"
	"math/rand/v2"
	"time"

	"github.com/google/uuid"
)

// Reservations are numbered in the order they are made. A reservation ID is
// a version 4 UUID that carries its number: its first eight bytes (with the
// version nibble) are random (reservationRandom), the other
// eight hold the variant bits and the number masked by a keyed mix of the
// random half. The ID's text is random-looking, unique (the numbers are) and
// decodes back to its number without a map: the reservation's slot in
// reservationTable, which stores the random half to tell the store's own IDs
// from any other text.

// reservationChunkBits sets how many slots a chunk of the table holds.
const reservationChunkBits = 10

const (
	reservationChunkLen = 1 << reservationChunkBits
	// seqMask covers the number's bits in the second half of an ID.
	seqMask = 1<<62 - 1
)

// reservationSlot is the state of one reservation: open (not ended) or how
// it ended (a retained terminal), or empty (never made, swept or released).
type reservationSlot struct {
	random uint64
	// deadline is when a terminal is swept, as an offset from the store's
	// epoch.
	deadline time.Duration
	state    reservationState
}

// reservationOpen is the state of a slot whose reservation has not ended.
const reservationOpen reservationState = 0xff

// reservationChunk holds consecutive slots. It holds no pointer, so that the
// collector does not scan it.
type reservationChunk struct {
	slots [reservationChunkLen]reservationSlot
	// refs counts the slots that are not empty.
	refs int
}

// reservationTable holds the slots of the reservations from first on. A
// chunk whose slots are all empty (and all made) is dropped.
type reservationTable struct {
	chunks []*reservationChunk
	// base is the chunk number of chunks[0].
	base uint64
	// next is the number of the next reservation.
	next uint64
	// terminals counts the retained terminals.
	terminals int
	// key keys the mask of the numbers.
	key uint64
}

// mix is a 64-bit finalizer (MurmurHash3's fmix64).
func mix(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}

// reservationRandom draws the random half of a new reservation's ID, with
// the version bits set (version 4: the high nibble of byte 6). It takes no
// lock: math/rand/v2's top-level generator is the runtime's per-thread
// ChaCha8, seeded from the system's randomness.
func reservationRandom() uint64 {
	return rand.Uint64()&^(0xf<<12) | 0x4<<12
}

// open numbers a new reservation whose ID's random half is hi (from
// reservationRandom) and returns its number and the ID's other half.
func (t *reservationTable) open(hi uint64) (seq, lo uint64) {
	seq = t.next
	t.next++
	if seq&(reservationChunkLen-1) == 0 || len(t.chunks) == 0 {
		t.chunks = append(t.chunks, new(reservationChunk))
	}
	lo = (seq^mix(hi^t.key))&seqMask | 1<<63 // RFC 4122 variant: 0b10
	c := t.chunks[len(t.chunks)-1]
	c.slots[seq&(reservationChunkLen-1)] = reservationSlot{random: hi, state: reservationOpen}
	c.refs++
	return seq, lo
}

// reservationUUID returns the ID whose halves are hi and lo.
func reservationUUID(hi, lo uint64) (id uuid.UUID) {
	binary.BigEndian.PutUint64(id[:8], hi)
	binary.BigEndian.PutUint64(id[8:], lo)
	return id
}

// decode returns the number of the reservation id names, if id is one this
// table made (whatever its state).
func (t *reservationTable) decode(id uuid.UUID) (seq uint64, ok bool) {
	hi := binary.BigEndian.Uint64(id[:8])
	lo := binary.BigEndian.Uint64(id[8:])
	if lo>>62 != 0b10 {
		return 0, false
	}
	seq = (lo ^ mix(hi^t.key)) & seqMask
	s := t.slot(seq)
	if s == nil || s.state == 0 || s.random != hi {
		return 0, false
	}
	return seq, true
}

// slot returns the slot of reservation seq, or nil when its chunk is gone.
func (t *reservationTable) slot(seq uint64) *reservationSlot {
	c := t.chunk(seq)
	if c == nil {
		return nil
	}
	return &c.slots[seq&(reservationChunkLen-1)]
}

func (t *reservationTable) chunk(seq uint64) *reservationChunk {
	if seq >= t.next {
		return nil
	}
	n := seq >> reservationChunkBits
	if n < t.base || n-t.base >= uint64(len(t.chunks)) {
		return nil
	}
	return t.chunks[n-t.base]
}

// terminal returns the retained terminal of reservation id.
func (t *reservationTable) terminal(id uuid.UUID) (reservationTerminal, bool) {
	seq, ok := t.decode(id)
	if !ok {
		return reservationTerminal{}, false
	}
	s := t.slot(seq)
	if s.state == reservationOpen {
		return reservationTerminal{}, false
	}
	return reservationTerminal{state: s.state, deadline: s.deadline}, true
}

// end records how reservation seq ended; it is swept at deadline.
func (t *reservationTable) end(seq uint64, state reservationState, deadline time.Duration) {
	s := t.slot(seq)
	if s == nil || s.state == 0 {
		// Not reachable: a reservation ends once, while its row holds
		// its slot.
		panic("memory: ending a reservation without a slot")
	}
	if s.state == reservationOpen {
		t.terminals++
	}
	s.state, s.deadline = state, deadline
}

// sweep empties the slot of reservation seq if it holds the terminal due at
// deadline.
func (t *reservationTable) sweep(seq uint64, deadline time.Duration) {
	if s := t.slot(seq); s != nil && s.state != 0 && s.state != reservationOpen && s.deadline == deadline {
		t.terminals--
		t.release(seq, s)
	}
}

// drop empties the slot of an open reservation whose row is gone without a
// terminal.
func (t *reservationTable) drop(seq uint64) {
	if s := t.slot(seq); s != nil && s.state == reservationOpen {
		t.release(seq, s)
	}
}

// release empties slot s of reservation seq and drops its chunk once every
// slot of it is made and empty.
func (t *reservationTable) release(seq uint64, s *reservationSlot) {
	*s = reservationSlot{}
	n := seq >> reservationChunkBits
	c := t.chunks[n-t.base]
	c.refs--
	if c.refs > 0 || (n+1)<<reservationChunkBits > t.next {
		return
	}
	t.chunks[n-t.base] = nil
	for len(t.chunks) > 0 && t.chunks[0] == nil {
		t.chunks[0] = nil
		t.chunks = t.chunks[1:]
		t.base++
	}
	if len(t.chunks) == 0 {
		// Every made slot is empty: restart the slice.
		t.chunks = nil
		t.base = t.next >> reservationChunkBits
	}
}

// chunkCount returns how many chunks the table holds.
func (t *reservationTable) chunkCount() int {
	n := 0
	for _, c := range t.chunks {
		if c != nil {
			n++
		}
	}
	return n
}
