package view_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/memory"
	"github.com/zlink-systems/authority/view"
)

func TestViewReadsMemory(t *testing.T) {
	_, h := memoryHarness(t, memory.Config{})
	testViewReads(t, h, false)
}

// TestViewReadsEtcd runs the view on etcd: from memory on a server whose
// progress notifications are reliable, from the store on an older one
// (CI's external 3.4.23).
func TestViewReadsEtcd(t *testing.T) {
	_, h, client := etcdHarness(t, false)
	st, err := client.Status(t.Context(), client.Endpoints()[0])
	require.NoError(t, err)
	t.Logf("etcd %s: progress notifications reliable: %v", st.Version, etcdstore.ProgressNotifyReliable(st.Version))
	testViewReads(t, h, !etcdstore.ProgressNotifyReliable(st.Version))
}

// newView starts a view of every row of h's store, closed when t ends.
func newView(t testing.TB, h *conformance.Harness, cfg view.Config) *view.View {
	v, err := view.New(t.Context(), h.Store.(view.Store), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = v.Close() })
	return v
}

// testViewReads writes through the store and reads each change back from
// the view at once: a consistent read reflects every write that completed
// before it (read-your-writes across clients), and a listing is the store's.
func testViewReads(t *testing.T, h *conformance.Harness, fromStore bool) {
	fx := conformance.NewFixture(t, h)
	for i := range 5 {
		fx.Active(authority.ObjectUserSpot, fmt.Sprintf("before-%d", i), conformance.TargetA)
	}
	v := newView(t, h, view.Config{})
	requireSame := func(key authority.Key) {
		t.Helper()
		want := fx.Read(key)
		got, err := v.Read(fx.Ctx(), key, view.Freshness{})
		require.NoError(t, err)
		require.Equal(t, fromStore, got.FromStore)
		require.Equal(t, want.Kind, got.Kind, "row %s", key)
		require.GreaterOrEqual(t, got.Revision, int64(1))
		if want.Kind == authority.KindSnapshot {
			conformance.RequireSameRow(t, want.Snapshot, got.Snapshot)
		}
	}
	for i := range 30 {
		id := fmt.Sprintf("row-%d", i%7)
		key := fx.Key(authority.ObjectUserSpot, id)
		switch res := fx.Read(key); {
		case res.Kind == authority.KindMissing:
			fx.Active(authority.ObjectUserSpot, id, conformance.TargetB)
		case i%3 == 0:
			fx.Delete(key, res.Snapshot.StoreVersion)
		default:
			fx.Put(key, res.Snapshot.StoreVersion, []byte(fmt.Sprintf("put-%d", i)))
		}
		requireSame(key)
		requireSame(fx.Key(authority.ObjectUserSpot, "before-1"))
	}
	requireListing(t, fx, v, authority.KindPrefix(authority.ObjectUserSpot), 3)

	_, err := v.Read(fx.Ctx(), "user_spot/\x00", view.Freshness{})
	require.ErrorIs(t, err, authority.ErrInvalidArgument)
}

// requireListing requires the view's listing of prefix, in pages of limit,
// to be the store's, every page at one revision.
func requireListing(t *testing.T, fx *conformance.Fixture, v *view.View, prefix string, limit int) {
	t.Helper()
	want := fx.ListAll(prefix, authority.MaxScanLimit)
	var got []authority.ScanItem
	var cursor authority.ScanCursor
	var rev int64
	for {
		p, err := v.List(fx.Ctx(), prefix, cursor, limit, view.Freshness{})
		require.NoError(t, err)
		require.Equal(t, authority.KindPage, p.Kind)
		if rev != 0 {
			require.Equal(t, rev, p.Revision, "pages of one listing at one revision")
		}
		rev = p.Revision
		got = append(got, p.Items...)
		if p.NextCursor == "" {
			break
		}
		cursor = p.NextCursor
	}
	require.Len(t, got, len(want))
	for i := range want {
		require.Equal(t, want[i].Key, got[i].Key)
		conformance.RequireSameRow(t, want[i].Snapshot, got[i].Snapshot)
	}
}

// TestViewStaleReads checks bounded-stale reads: within the bound after a
// consistent read they answer at the view's revision; with a bound shorter
// than the time since, they see a write completed before them.
func TestViewStaleReads(t *testing.T) {
	_, h := memoryHarness(t, memory.Config{})
	fx := conformance.NewFixture(t, h)
	key := fx.Key(authority.ObjectUserSpot, "s")
	snap := fx.Active(authority.ObjectUserSpot, "s", conformance.TargetA)
	v := newView(t, h, view.Config{})
	_, err := v.Read(fx.Ctx(), key, view.Freshness{})
	require.NoError(t, err)
	stale, err := v.Read(fx.Ctx(), key, view.Freshness{MaxStaleness: time.Hour})
	require.NoError(t, err)
	require.Equal(t, v.Revision(), stale.Revision)

	put := fx.Put(key, snap.StoreVersion, []byte("new"))
	start := time.Now()
	for time.Since(start) < time.Millisecond {
		time.Sleep(100 * time.Microsecond)
	}
	fresh, err := v.Read(fx.Ctx(), key, view.Freshness{MaxStaleness: time.Since(start) / 2})
	require.NoError(t, err)
	conformance.RequireSameRow(t, put, fresh.Snapshot)
}

// TestViewRelistsAfterRetention lets the memory store's feed history drop
// changes the view has not read yet (FeedRetention 1): the view relists and
// then answers as the store does.
func TestViewRelistsAfterRetention(t *testing.T) {
	_, h := memoryHarness(t, memory.Config{FeedRetention: 1})
	fx := conformance.NewFixture(t, h)
	v := newView(t, h, view.Config{})
	ctx, cancel := context.WithTimeout(fx.Ctx(), time.Minute)
	defer cancel()
	for i := 0; v.Relists() == 0; i++ {
		require.NoError(t, ctx.Err(), "the view never fell behind the retention")
		fx.Active(authority.ObjectUserSpot, fmt.Sprintf("r-%d", i), conformance.TargetA)
	}
	requireListing(t, fx, v, authority.KindPrefix(authority.ObjectUserSpot), authority.MaxScanLimit)
}

// TestViewPrefix checks that a view keeps only its prefix and refuses
// reads and listings outside it.
func TestViewPrefix(t *testing.T) {
	_, h := memoryHarness(t, memory.Config{})
	fx := conformance.NewFixture(t, h)
	fx.Active(authority.ObjectActor, "a", conformance.TargetA)
	fx.Active(authority.ObjectUserSpot, "s", conformance.TargetA)
	v := newView(t, h, view.Config{Prefix: authority.KindPrefix(authority.ObjectUserSpot)})
	_, err := v.Read(fx.Ctx(), fx.Key(authority.ObjectActor, "a"), view.Freshness{})
	require.ErrorIs(t, err, authority.ErrInvalidArgument)
	_, err = v.List(fx.Ctx(), "", "", 10, view.Freshness{})
	require.ErrorIs(t, err, authority.ErrInvalidArgument)
	requireListing(t, fx, v, authority.KindPrefix(authority.ObjectUserSpot), 10)
}
