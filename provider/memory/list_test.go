package memory

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
)

// fill adds n committed Spots s00000.. and, for every third, an Actor
// reservation, straight into the store.
func (e *env) fill(n int) {
	e.t.Helper()
	for i := range n {
		e.spot(fmt.Sprintf("s%05d", i))
		if i%3 == 0 {
			require.Equal(e.t, authority.KindReserved, e.reserve(actorRequest(fmt.Sprintf("a%05d", i), target(nodeA, ownerA))).Kind)
		}
	}
}

// listAll pages through prefix and returns the items, or the kind that
// ended the listing early.
func (e *env) listAll(prefix string, limit int, between func(page int)) ([]authority.ScanItem, authority.ResultKind) {
	e.t.Helper()
	var items []authority.ScanItem
	var cursor authority.ScanCursor
	for page := 0; ; page++ {
		res, err := e.s.ListAuthorities(e.ctx, prefix, cursor, limit)
		require.NoError(e.t, err)
		if res.Kind != authority.KindPage {
			return items, res.Kind
		}
		require.LessOrEqual(e.t, len(res.Items), limit)
		items = append(items, res.Items...)
		if res.NextCursor == "" {
			return items, authority.KindPage
		}
		require.Len(e.t, res.Items, limit)
		if between != nil {
			between(page)
		}
		cursor = res.NextCursor
	}
}

func TestListPaging(t *testing.T) {
	e := newEnv(t)
	e.fill(250)
	prefix := authority.KindPrefix(authority.ObjectUserSpot)
	for _, limit := range []int{1, 7, 100, 250, 1000} {
		items, kind := e.listAll(prefix, limit, nil)
		require.Equal(t, authority.KindPage, kind)
		require.Len(t, items, 250, "limit %d", limit)
		for i, it := range items {
			require.Equal(t, authority.Key(fmt.Sprintf("user_spot/s%05d", i)), it.Key)
			require.Equal(t, it.Key, e.keyOf(it.Snapshot))
		}
	}
	actors, _ := e.listAll(authority.KindPrefix(authority.ObjectActor), 30, nil)
	require.Len(t, actors, 84)
	require.NotNil(t, actors[0].Snapshot.PendingCreation)
	all, _ := e.listAll("", 1000, nil)
	require.Len(t, all, 334)
	none, kind := e.listAll("nothing/", 10, nil)
	require.Equal(t, authority.KindPage, kind)
	require.Empty(t, none)

	// Items are the caller's copies.
	first, err := e.s.ListAuthorities(e.ctx, prefix, "", 2)
	require.NoError(t, err)
	first.Items[0].Snapshot.Payload = append(first.Items[0].Snapshot.Payload[:0], "XXXXXXXXXXXXXXXXXXXX"...)
	require.Equal(t, []byte("ready:s00001"), first.Items[1].Snapshot.Payload)
	require.Equal(t, []byte("ready:s00000"), e.read("user_spot/s00000").Snapshot.Payload)
}

// keyOf finds the key of a listed snapshot by its payload.
func (e *env) keyOf(s *authority.Snapshot) authority.Key {
	return authority.Key("user_spot/" + string(s.Payload[len("ready:"):]))
}

func TestListCursorChecks(t *testing.T) {
	e := newEnv(t)
	e.fill(20)
	res, err := e.s.ListAuthorities(e.ctx, "user_spot/", "", 5)
	require.NoError(t, err)
	require.NotEmpty(t, res.NextCursor)
	_, err = e.s.ListAuthorities(e.ctx, "actor/", res.NextCursor, 5)
	require.ErrorIs(t, err, authority.ErrInvalidArgument, "cursor for another prefix")
	other := newEnv(t)
	other.fill(20)
	_, err = other.s.ListAuthorities(other.ctx, "user_spot/", res.NextCursor, 5)
	require.ErrorIs(t, err, authority.ErrInvalidArgument, "cursor of another store")
	_, err = e.s.ListAuthorities(e.ctx, "user_spot/", res.NextCursor+"x", 5)
	require.ErrorIs(t, err, authority.ErrInvalidArgument, "corrupt cursor")

	// A cursor for a revision this store never pinned has expired.
	forged := authority.EncodeScanCursor(authority.ScanPosition{Scope: e.s.scope, Prefix: "user_spot/", Revision: 12345, After: "user_spot/s00004"})
	out, err := e.s.ListAuthorities(e.ctx, "user_spot/", forged, 5)
	require.NoError(t, err)
	require.Equal(t, authority.KindScanExpired, out.Kind)
}

func TestListExpiry(t *testing.T) {
	e := newEnv(t, func(o *Config) { o.ScanRetention = time.Minute; o.MaxPinnedScans = 2 })
	e.fill(20)
	start := func() authority.ScanCursor {
		res, err := e.s.ListAuthorities(e.ctx, "user_spot/", "", 5)
		require.NoError(t, err)
		return res.NextCursor
	}
	next := func(c authority.ScanCursor) authority.ResultKind {
		res, err := e.s.ListAuthorities(e.ctx, "user_spot/", c, 5)
		require.NoError(t, err)
		return res.Kind
	}

	c := start()
	e.s.ExpireScans()
	require.Equal(t, authority.KindScanExpired, next(c), "ExpireScans")

	c = start()
	e.clock.Advance(time.Minute)
	require.Equal(t, authority.KindScanExpired, next(c), "ScanRetention")

	// Listings at one revision share a pin; a third revision drops the first.
	c1 := start()
	c1b := start()
	e.spot("x1")
	c2 := start()
	e.spot("x2")
	c3 := start()
	require.Equal(t, authority.KindScanExpired, next(c1))
	require.Equal(t, authority.KindScanExpired, next(c1b))
	require.Equal(t, authority.KindPage, next(c2))
	require.Equal(t, authority.KindPage, next(c3))
	e.s.mu.Lock()
	require.Len(t, e.s.pins, 2)
	e.s.mu.Unlock()
}

// TestListSnapshotUnderWrites pages through rows while other goroutines
// move pairs of rows between owners with aggregates (both rows of a pair
// always have the same owner in any consistent state; the pair's rows are on
// different pages): no listing may show a pair split.
func TestListSnapshotUnderWrites(t *testing.T) {
	e := newEnv(t)
	const n, half = 600, 300
	e.fill(n)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var moves [4]int
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				pair := (i*4 + w) % half
				k1 := authority.Key(fmt.Sprintf("user_spot/s%05d", pair))
				k2 := authority.Key(fmt.Sprintf("user_spot/s%05d", pair+half))
				r1, _ := e.s.ReadAuthority(e.ctx, k1)
				r2, _ := e.s.ReadAuthority(e.ctx, k2)
				req := moveRequest(int64(i+1), map[authority.Key]*authority.Snapshot{k1: r1.Snapshot, k2: r2.Snapshot}, nil)
				req.AggregateID = fmt.Sprintf("w%d", w)
				if r1.Snapshot.OwnerID == ownerB.OwnerID {
					req.TargetOwner, req.TargetDescriptor = ownerA, nodeA
				}
				if res, err := e.s.PrepareAggregate(e.ctx, req); err != nil || res.Kind != authority.KindPrepared {
					t.Errorf("prepare: %v %v", res.Kind, err)
					return
				}
				if res, err := e.s.CommitAggregate(e.ctx, req.Fence()); err != nil || res.Kind != authority.KindCommitted {
					t.Errorf("commit: %v %v", res.Kind, err)
					return
				}
				moves[w]++
			}
		}()
	}
	for range 30 {
		items, kind := e.listAll("user_spot/", 50, nil)
		require.Equal(t, authority.KindPage, kind)
		require.Len(t, items, n)
		for i := range half {
			require.Equal(t, items[i].Snapshot.Owner(), items[i+half].Snapshot.Owner(), "pair %d torn", i)
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("moves during the listings: %v", moves)
}

// TestListIgnoresLaterWrites starts a listing, then deletes and adds rows
// between its pages: it returns exactly the rows of its first page's state.
func TestListIgnoresLaterWrites(t *testing.T) {
	e := newEnv(t)
	const n = 600
	e.fill(n)
	snapshot := map[authority.Key]authority.StoreVersion{}
	e.s.mu.Lock()
	e.s.index.Scan(func(r *row) bool {
		if r.snap.Allocation.State == authority.AllocationActive {
			snapshot[r.key] = r.storeVersion()
		}
		return true
	})
	e.s.mu.Unlock()
	got, kind := e.listAll("user_spot/", 50, func(page int) {
		for w := range 4 {
			key := authority.Key(fmt.Sprintf("user_spot/s%05d", page*40+w))
			cur := e.read(key)
			if cur.Kind == authority.KindSnapshot {
				require.Equal(t, authority.KindDeleted, e.cas(key, cur.Snapshot.StoreVersion, authority.Delete()).Kind)
			}
			require.Equal(t, authority.KindReserved, e.reserve(spotRequest(fmt.Sprintf("s%05d-new", page*40+w), target(nodeA, ownerA))).Kind)
		}
	})
	require.Equal(t, authority.KindPage, kind)
	require.Len(t, got, len(snapshot))
	for _, it := range got {
		require.Equal(t, snapshot[it.Key], it.Snapshot.StoreVersion, string(it.Key))
	}
	// A new listing sees the writes.
	after, _ := e.listAll("user_spot/", 1000, nil)
	require.Len(t, after, n-4*(n/50-1)+4*(n/50-1))
	require.NotEqual(t, got[0].Key, after[0].Key)
}
