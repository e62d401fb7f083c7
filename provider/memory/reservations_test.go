package memory

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
)

// chunks returns how many chunks the store's reservation table holds.
func (e *env) chunks() int {
	e.s.mu.Lock()
	defer e.s.mu.Unlock()
	return e.s.reservations.chunkCount()
}

// TestReservationTableReleasesChunks commits and aborts reservations over
// several chunks: once their terminals are swept the chunks go, and the
// terminals of another store, or of no store, are never found.
func TestReservationTableReleasesChunks(t *testing.T) {
	e := newEnv(t, func(o *Config) { o.ReservationRetention = time.Minute })
	const n = 3*reservationChunkLen + 17
	commits := make([]authority.CommitRequest, 0, n)
	aborts := make([]authority.AbortRequest, 0, n)
	for i := range n {
		req := spotRequest(fmt.Sprintf("s%d", i), target(nodeA, ownerA))
		res := e.reserve(req)
		require.Equal(t, authority.KindReserved, res.Kind)
		if i%2 == 0 {
			c := commitRequest(req, res, "ready")
			require.Equal(t, authority.KindCommitted, e.commit(c).Kind)
			commits = append(commits, c)
			continue
		}
		a := authority.AbortRequest{Key: req.Key, ReservationID: res.ReservationID, ExpectedStoreVersion: res.Creating.StoreVersion, Target: req.Target}
		out, err := e.s.Abort(e.ctx, a)
		require.NoError(t, err)
		require.Equal(t, authority.KindAborted, out.Kind)
		aborts = append(aborts, a)
	}
	require.Equal(t, n, e.state().reservations)
	require.Equal(t, 4, e.chunks())

	// Every repeat finds its terminal; an ID of another store finds none.
	other := newEnv(t)
	for _, c := range commits {
		require.Equal(t, authority.KindAlreadyCommitted, e.commit(c).Kind)
		// Another store has the row too (made with its own ID), not the
		// terminal of this ID.
		req := spotRequest(string(c.Key.GlobalID), target(nodeA, ownerA))
		res := other.reserve(req)
		require.Equal(t, authority.KindReserved, res.Kind)
		require.NotEqual(t, c.ReservationID, res.ReservationID)
		require.Equal(t, authority.KindCommitted, other.commit(commitRequest(req, res, "x")).Kind)
		require.Equal(t, authority.KindStale, other.commit(c).Kind)
	}
	for _, a := range aborts {
		out, err := e.s.Abort(e.ctx, a)
		require.NoError(t, err)
		require.Equal(t, authority.KindAlreadyAborted, out.Kind)
	}

	// Past retention, the next write sweeps every terminal and the full
	// chunks go; the repeats are stale.
	e.clock.Advance(time.Minute)
	e.spot("after")
	require.Equal(t, 1, e.state().reservations)
	require.Equal(t, 1, e.chunks())
	require.Equal(t, authority.KindStale, e.commit(commits[0]).Kind)
	out, err := e.s.Abort(e.ctx, aborts[len(aborts)-1])
	require.NoError(t, err)
	require.Equal(t, authority.KindStale, out.Kind)
}

// TestReservationTableOpenReservations removes reserved rows by owner: their
// open slots are released, so their chunks go, and their IDs commit nothing.
func TestReservationTableOpenReservations(t *testing.T) {
	e := newEnv(t)
	const n = 2*reservationChunkLen + 5
	var last authority.CommitRequest
	for i := range n {
		req := spotRequest(fmt.Sprintf("s%d", i), target(nodeA, ownerA))
		res := e.reserve(req)
		require.Equal(t, authority.KindReserved, res.Kind)
		last = commitRequest(req, res, "ready")
	}
	require.Equal(t, 3, e.chunks())
	removed, err := e.s.RemoveAllByOwner(e.ctx, ownerA)
	require.NoError(t, err)
	require.EqualValues(t, n, removed)
	// The last chunk is not full yet: it stays until it is.
	require.Equal(t, 1, e.chunks())
	require.Equal(t, 0, e.state().reservations)
	require.Equal(t, authority.KindStale, e.commit(last).Kind)

	// Numbering goes on where it was; new reservations work as before.
	for i := range reservationChunkLen {
		e.spot(fmt.Sprintf("t%d", i))
	}
	require.Equal(t, reservationChunkLen, e.state().reservations)
	require.Equal(t, 2, e.chunks())
}

// TestReservationIDsLookRandom checks the IDs of consecutive reservations:
// valid version 4 UUIDs, unique, with no byte that stays put or counts up.
func TestReservationIDsLookRandom(t *testing.T) {
	e := newEnv(t)
	const n = 256
	ids := make([]uuid.UUID, n)
	seen := make(map[uuid.UUID]bool, n)
	for i := range n {
		res := e.reserve(spotRequest(fmt.Sprintf("s%d", i), target(nodeA, ownerA)))
		id, err := uuid.Parse(res.ReservationID)
		require.NoError(t, err)
		require.Equal(t, uuid.Version(4), id.Version())
		require.Equal(t, uuid.RFC4122, id.Variant())
		require.False(t, seen[id])
		seen[id] = true
		ids[i] = id
	}
	for b := range 16 {
		distinct := make(map[byte]bool)
		for _, id := range ids {
			v := id[b]
			switch b {
			case 6:
				v &= 0x0f // the version nibble is fixed
			case 8:
				v &= 0x3f // so are the variant bits
			}
			distinct[v] = true
		}
		// 256 random draws of 4 to 8 bits hit most values.
		require.Greater(t, len(distinct), 12, "byte %d", b)
	}
}

// TestReserveLargePayload reserves and commits with payloads too large for
// the row's inline buffer: they are stored and returned whole.
func TestReserveLargePayload(t *testing.T) {
	e := newEnv(t)
	req := spotRequest("big", target(nodeA, ownerA))
	req.CreatingPayload = bytes.Repeat([]byte("c"), blockInlineBytes+1)
	res := e.reserve(req)
	require.Equal(t, authority.KindReserved, res.Kind)
	require.Equal(t, req.CreatingPayload, res.Creating.Payload)
	key := mustKey(t, req.Key)
	require.Equal(t, req.CreatingPayload, e.read(key).Snapshot.Payload)
	ready := bytes.Repeat([]byte("r"), 3*blockInlineBytes)
	c := e.commit(commitRequest(req, res, string(ready)))
	require.Equal(t, authority.KindCommitted, c.Kind)
	require.Equal(t, ready, c.Ready.Payload)
	require.Equal(t, ready, e.read(key).Snapshot.Payload)
}
