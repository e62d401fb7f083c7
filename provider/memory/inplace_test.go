package memory

import (
	"bytes"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"unsafe"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
)

// storeVersion returns the row's store version.
func (r *row) storeVersion() authority.StoreVersion { return version(r.version) }

// rowPointer returns the row value stored at key.
func (e *env) rowPointer(key authority.Key) *row {
	e.s.mu.Lock()
	defer e.s.mu.Unlock()
	return e.s.row(key)
}

// TestInPlaceWritesKeepResultsStable rewrites one row many times in place:
// every result handed out before stays as it was, and a caller changing a
// result's bytes changes nothing in the store.
func TestInPlaceWritesKeepResultsStable(t *testing.T) {
	e := newEnv(t)
	key, ready := e.spot("s1")
	stored := e.rowPointer(key)
	type seen struct {
		snap    *authority.Snapshot
		version authority.StoreVersion
		payload []byte
	}
	history := []seen{{ready, ready.StoreVersion, bytes.Clone(ready.Payload)}}
	buf := make([]byte, 8)
	for i := range 20 {
		copy(buf, fmt.Sprintf("put%05d", i)) // the caller reuses its buffer
		last := history[len(history)-1]
		res := e.cas(key, last.version, authority.Put(buf))
		require.Equal(t, authority.KindStored, res.Kind)
		require.Equal(t, buf, res.Snapshot.Payload)
		history = append(history, seen{res.Snapshot, res.Snapshot.StoreVersion, bytes.Clone(res.Snapshot.Payload)})
	}
	require.Same(t, stored, e.rowPointer(key), "writes without listings rewrite the row in place")
	for i, h := range history {
		require.Equal(t, h.version, h.snap.StoreVersion, "result %d: version changed", i)
		require.Equal(t, h.payload, h.snap.Payload, "result %d: payload changed", i)
	}
	latest := history[len(history)-1].snap
	latest.Payload[0] = 'X'
	got := e.read(key)
	require.Equal(t, latest.StoreVersion, got.Snapshot.StoreVersion)
	require.Equal(t, []byte("put00019"), got.Snapshot.Payload, "a caller's change reached the store")
}

// TestInPlaceWritesSparePinnedRows pins a listing, rewrites every row, and
// checks that the listing still reads the old rows (the writes stored
// successors), that rows written after the pin are then rewritten in place,
// and that dropping the pin allows in-place writes again.
func TestInPlaceWritesSparePinnedRows(t *testing.T) {
	e := newEnv(t)
	const n = 30
	before := map[authority.Key]*authority.Snapshot{}
	for i := range n {
		key, snap := e.spot(fmt.Sprintf("s%03d", i))
		before[key] = snap
	}
	first, err := e.s.ListAuthorities(e.ctx, "user_spot/", "", 10)
	require.NoError(t, err)
	require.NotEmpty(t, first.NextCursor)

	after := map[authority.Key]*authority.Snapshot{}
	for key, snap := range before {
		old := e.rowPointer(key)
		res := e.cas(key, snap.StoreVersion, authority.Put([]byte("new:"+string(key))))
		require.Equal(t, authority.KindStored, res.Kind)
		require.NotSame(t, old, e.rowPointer(key), "a pinned row was rewritten in place")
		after[key] = res.Snapshot
	}
	// Rows written after the pin are not visible to it: in place.
	for key, snap := range after {
		cur := e.rowPointer(key)
		res := e.cas(key, snap.StoreVersion, authority.Put([]byte("newer:"+string(key))))
		require.Equal(t, authority.KindStored, res.Kind)
		require.Same(t, cur, e.rowPointer(key))
		after[key] = res.Snapshot
	}

	items := append([]authority.ScanItem(nil), first.Items...)
	for cursor := first.NextCursor; cursor != ""; {
		res, err := e.s.ListAuthorities(e.ctx, "user_spot/", cursor, 10)
		require.NoError(t, err)
		require.Equal(t, authority.KindPage, res.Kind)
		items = append(items, res.Items...)
		cursor = res.NextCursor
	}
	require.Len(t, items, n)
	for _, it := range items {
		want := before[it.Key]
		require.Equal(t, want.StoreVersion, it.Snapshot.StoreVersion, string(it.Key))
		require.Equal(t, want.Payload, it.Snapshot.Payload, string(it.Key))
	}

	e.s.ExpireScans()
	for key, snap := range after {
		cur := e.rowPointer(key)
		res := e.cas(key, snap.StoreVersion, authority.Put([]byte("last")))
		require.Equal(t, authority.KindStored, res.Kind)
		require.Same(t, cur, e.rowPointer(key), "no pin left: in place")
	}
}

// TestInPlaceCommit checks that a commit rewrites the reserved row in place
// and that the reserved snapshot handed out by Reserve is untouched.
func TestInPlaceCommit(t *testing.T) {
	e := newEnv(t)
	req := spotRequest("s1", target(nodeA, ownerA))
	res := e.reserve(req)
	creating := res.Creating
	keep := *creating
	keepPayload := bytes.Clone(creating.Payload)
	keepPending := *creating.PendingCreation
	key := mustKey(t, req.Key)
	stored := e.rowPointer(key)
	c := e.commit(commitRequest(req, res, "ready"))
	require.Equal(t, authority.KindCommitted, c.Kind)
	require.Same(t, stored, e.rowPointer(key))
	require.Equal(t, keep.StoreVersion, creating.StoreVersion)
	require.Equal(t, keepPayload, creating.Payload)
	require.Equal(t, keepPending, *creating.PendingCreation)
	require.Equal(t, res.ReservationID, creating.PendingCreation.ReservationID)
	require.Equal(t, []byte("ready"), c.Ready.Payload)
	require.Nil(t, c.Ready.PendingCreation)
	require.Equal(t, authority.KindAlreadyCommitted, e.commit(commitRequest(req, res, "ready")).Kind)
}

// TestListingsAndInPlaceWritesConcurrently rewrites rows while listings copy
// them: under -race this shows that no row is rewritten while a listing
// copies it, and every listed payload is one whole write.
func TestListingsAndInPlaceWritesConcurrently(t *testing.T) {
	e := newEnv(t)
	const n = 200
	keys := make([]authority.Key, n)
	versions := make([]authority.StoreVersion, n)
	for i := range n {
		var snap *authority.Snapshot
		keys[i], snap = e.spot(fmt.Sprintf("s%03d", i))
		versions[i] = snap.StoreVersion
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		payload := make([]byte, 48)
		for round := 0; ; round++ {
			select {
			case <-stop:
				return
			default:
			}
			for i := range payload {
				payload[i] = byte('a' + round%26)
			}
			for j, key := range keys {
				res, err := e.s.CompareExchangeAuthority(e.ctx, key, versions[j], authority.Put(payload))
				if err != nil || res.Kind != authority.KindStored {
					t.Errorf("cas: %v %v", res.Kind, err)
					return
				}
				versions[j] = res.Snapshot.StoreVersion
			}
		}
	}()
	for range 40 {
		for _, limit := range []int{1000, 7} {
			items, kind := e.listAll("user_spot/", limit, nil)
			require.Equal(t, authority.KindPage, kind)
			require.Len(t, items, n)
			for _, it := range items {
				p := it.Snapshot.Payload
				if len(p) == 48 {
					require.Equal(t, bytes.Repeat(p[:1], 48), p, "torn payload")
				}
			}
		}
		r, err := e.s.ReadAuthority(e.ctx, keys[0])
		require.NoError(t, err)
		require.Equal(t, authority.KindSnapshot, r.Kind)
	}
	close(stop)
	wg.Wait()
}

func TestReservationIDText(t *testing.T) {
	e := newEnv(t)
	seen := make(map[string]bool)
	for i := range 100 {
		seq, id := e.s.newReservation()
		require.Equal(t, uint64(i), seq)
		var text [uuidTextLen]byte
		encodeUUID(&text, id)
		require.Equal(t, id.String(), string(text[:]))
		parsed, err := uuid.Parse(string(text[:]))
		require.NoError(t, err)
		require.Equal(t, uuid.Version(4), parsed.Version())
		require.Equal(t, uuid.RFC4122, parsed.Variant())
		back, ok := parseReservationID(string(text[:]))
		require.True(t, ok)
		require.Equal(t, id, back)
		require.False(t, seen[id.String()])
		seen[id.String()] = true
		// The ID decodes to its number; a change of any bit does not.
		got, ok := e.s.reservations.decode(id)
		require.True(t, ok)
		require.Equal(t, seq, got)
		for bit := range 128 {
			other := id
			other[bit/8] ^= 1 << (bit % 8)
			_, ok := e.s.reservations.decode(other)
			require.False(t, ok, "bit %d", bit)
		}
	}
	good := "0123abcd-4567-89ef-0123-456789abcdef"
	_, ok := parseReservationID(good)
	require.True(t, ok)
	for _, bad := range []string{
		"", good[:35], good + "0", "0123ABCD-4567-89ef-0123-456789abcdef",
		"0123abcd_4567-89ef-0123-456789abcdef", "0123abcd-4567-89ef-0123-456789abcdeg",
		"{123abcd-4567-89ef-0123-456789abcde}", "0123abcd-4567-89ef-0123-456789abcd-f",
	} {
		_, ok := parseReservationID(bad)
		require.False(t, ok, bad)
	}
}

func TestVersionIs(t *testing.T) {
	for _, v := range []int64{1, 9, 10, 99, 100, 123456789, 999_999_999_999_999_999, 1_000_000_000_000_000_000, authority.MaxGeneration} {
		r := &row{version: v}
		text := strconv.FormatInt(v, 10)
		require.True(t, r.versionIs(authority.StoreVersion(text)), text)
		require.Equal(t, authority.StoreVersion(text), r.storeVersion())
		require.Equal(t, len(text), decimalLen(v))
		for _, other := range []string{"", "0", "0" + text, "+" + text, "-" + text, text + "0", text + "a", " " + text, strconv.FormatInt(v-1, 10)} {
			require.False(t, r.versionIs(authority.StoreVersion(other)), "%d vs %q", v, other)
		}
	}
	// 19 digits beyond MaxInt64 must not wrap onto a version.
	r := &row{version: authority.MaxGeneration}
	require.False(t, r.versionIs("9223372036854775808"))
	require.False(t, r.versionIs("18446744073709551615"))
	require.False(t, (&row{version: 7}).versionIs("18446744073709551623")) // 2^64 + 7
}

// TestAllocationSizes pins the inline buffers to the allocation size classes
// they are sized for: a change to the contract's types shows up here, not
// as a silent step up to the next size class.
func TestAllocationSizes(t *testing.T) {
	require.EqualValues(t, 416, unsafe.Sizeof(rowBlock{}))
	require.EqualValues(t, 224, unsafe.Sizeof(reservationPart{}))
	require.EqualValues(t, 320, unsafe.Sizeof(exportedActive{}))
	require.EqualValues(t, 416, unsafe.Sizeof(exportedPending{}))
}

// TestCellCache reserves on alternating nodes and after a counter emptied:
// the cached cells never count against the wrong counter.
func TestCellCache(t *testing.T) {
	e := newEnv(t)
	for i := range 6 {
		node, owner := nodeA, ownerA
		if i%2 == 1 {
			node, owner = nodeB, ownerB
		}
		require.Equal(t, authority.KindReserved, e.reserve(spotRequest(fmt.Sprintf("s%d", i), target(node, owner))).Kind)
	}
	require.Equal(t, authority.CapacityUsage{Reserved: 3}, e.usage(nodeA, authority.ObjectUserSpot, "chat"))
	require.Equal(t, authority.CapacityUsage{Reserved: 3}, e.usage(nodeB, authority.ObjectUserSpot, "chat"))

	// Empty node A's counters (their cells die), then reserve there again.
	for i := 0; i < 6; i += 2 {
		key := mustKey(t, authority.ObjectKey{Kind: authority.ObjectUserSpot, GlobalID: fmt.Sprintf("s%d", i)})
		r := e.read(key)
		res, err := e.s.Abort(e.ctx, authority.AbortRequest{
			Key: authority.ObjectKey{Kind: authority.ObjectUserSpot, GlobalID: fmt.Sprintf("s%d", i)}, ReservationID: r.Snapshot.PendingCreation.ReservationID,
			ExpectedStoreVersion: r.Snapshot.StoreVersion, Target: target(nodeA, ownerA),
		})
		require.NoError(t, err)
		require.Equal(t, authority.KindAborted, res.Kind)
	}
	require.Equal(t, authority.CapacityUsage{}, e.usage(nodeA, authority.ObjectUserSpot, "chat"))
	for i := range 2 {
		require.Equal(t, authority.KindReserved, e.reserve(spotRequest(fmt.Sprintf("again%d", i), target(nodeA, ownerA))).Kind)
	}
	require.Equal(t, authority.CapacityUsage{Reserved: 2}, e.usage(nodeA, authority.ObjectUserSpot, "chat"))
	require.Equal(t, authority.CapacityUsage{Reserved: 2}, e.usage(nodeA, authority.CounterSpots, ""))
	require.Equal(t, authority.CapacityUsage{Reserved: 3}, e.usage(nodeB, authority.ObjectUserSpot, "chat"))
	st := e.state()
	for c, cell := range st.counters {
		require.False(t, cell.dead, "%v", c)
	}
}
