package conformance

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
)

// RunTestList checks ListAuthorities: key order, paging (every row exactly
// once whatever the limit), prefix isolation, cursor checks, and that a
// listing is never torn by writes between its pages: it is either the
// snapshot of the first page's moment or ends in scanExpired.
func RunTestList(ctx context.Context, t *testing.T, f Factory) {
	// populate creates active actors with ids and returns their rows by key.
	populate := func(fx *Fixture, ids ...string) map[authority.Key]*authority.Snapshot {
		rows := map[authority.Key]*authority.Snapshot{}
		for _, id := range ids {
			rows[fx.Key(authority.ObjectActor, id)] = fx.Active(authority.ObjectActor, id, TargetA)
		}
		return rows
	}
	keysOf := func(items []authority.ScanItem) []authority.Key {
		keys := make([]authority.Key, len(items))
		for i, it := range items {
			keys[i] = it.Key
		}
		return keys
	}
	sortedKeys := func(rows map[authority.Key]*authority.Snapshot) []authority.Key {
		keys := make([]authority.Key, 0, len(rows))
		for k := range rows {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		return keys
	}
	list := func(t *testing.T, fx *Fixture, prefix string, cursor authority.ScanCursor, limit int) authority.ScanResult {
		t.Helper()
		res, err := fx.Store().ListAuthorities(fx.Ctx(), prefix, cursor, limit)
		require.NoError(t, err)
		return res
	}
	paging := func(limit int) func(t *testing.T, fx *Fixture) {
		return func(t *testing.T, fx *Fixture) {
			rows := populate(fx, "a", "B", "c", "D", "e", "F", "g")
			items := fx.ListAll(authority.KindPrefix(authority.ObjectActor), limit)
			require.Equal(t, sortedKeys(rows), keysOf(items), "every row exactly once, in byte order of keys")
			for _, it := range items {
				RequireSameRow(t, rows[it.Key], it.Snapshot)
			}
		}
	}
	// midScan lists six rows two at a time, calls change after the first
	// page, and requires the rest of the listing to be the snapshot of the
	// first page's moment or to expire.
	midScan := func(change func(t *testing.T, fx *Fixture, rows map[authority.Key]*authority.Snapshot)) func(t *testing.T, fx *Fixture) {
		return func(t *testing.T, fx *Fixture) {
			rows := populate(fx, "a", "b", "c", "d", "e", "f")
			prefix := authority.KindPrefix(authority.ObjectActor)
			want := fx.ListAll(prefix, authority.MaxScanLimit)
			res := list(t, fx, prefix, "", 2)
			require.Equal(t, authority.KindPage, res.Kind)
			require.NotEmpty(t, res.NextCursor)
			got := slices.Clone(res.Items)
			change(t, fx, rows)
			for cursor := res.NextCursor; cursor != ""; {
				res = list(t, fx, prefix, cursor, 2)
				if res.Kind == authority.KindScanExpired {
					return // the listing told the caller to start over
				}
				require.Equal(t, authority.KindPage, res.Kind)
				got = append(got, res.Items...)
				cursor = res.NextCursor
			}
			require.Equal(t, keysOf(want), keysOf(got), "a listing is the snapshot of its first page's moment")
			for i := range want {
				RequireSameRow(t, want[i].Snapshot, got[i].Snapshot)
			}
		}
	}
	invalid := func(t *testing.T, fx *Fixture, prefix string, cursor authority.ScanCursor) {
		t.Helper()
		res, err := fx.Store().ListAuthorities(fx.Ctx(), prefix, cursor, 2)
		require.Error(t, err, "result %+v", res)
		require.True(t, errors.Is(err, authority.ErrInvalidArgument), "error %v", err)
	}
	firstCursor := func(t *testing.T, fx *Fixture) authority.ScanCursor {
		t.Helper()
		populate(fx, "a", "b", "c")
		res := list(t, fx, authority.KindPrefix(authority.ObjectActor), "", 1)
		require.Equal(t, authority.KindPage, res.Kind)
		require.NotEmpty(t, res.NextCursor)
		return res.NextCursor
	}
	runSubtests(ctx, t, f, []subtest{
		{"Empty", func(t *testing.T, fx *Fixture) {
			res := list(t, fx, authority.KindPrefix(authority.ObjectActor), "", 10)
			require.Equal(t, authority.KindPage, res.Kind)
			require.Empty(t, res.Items)
			require.Empty(t, res.NextCursor)
		}},
		{"SinglePage", func(t *testing.T, fx *Fixture) {
			rows := populate(fx, "x", "y")
			res := list(t, fx, authority.KindPrefix(authority.ObjectActor), "", 10)
			require.Equal(t, authority.KindPage, res.Kind)
			require.Equal(t, sortedKeys(rows), keysOf(res.Items))
			require.Empty(t, res.NextCursor)
		}},
		{"LimitOneReturnsOne", func(t *testing.T, fx *Fixture) {
			populate(fx, "x", "y")
			res := list(t, fx, authority.KindPrefix(authority.ObjectActor), "", 1)
			require.Len(t, res.Items, 1)
			require.NotEmpty(t, res.NextCursor)
		}},
		{"PagingLimit1", paging(1)},
		{"PagingLimit2", paging(2)},
		{"PagingLimit3", paging(3)},
		{"PagingLimitExact", paging(7)},
		{"PagingLimitMax", paging(authority.MaxScanLimit)},
		{"ByteOrderOfEscapedKeys", func(t *testing.T, fx *Fixture) {
			rows := populate(fx, "a/b", "a%b", "a b", "a~", "a", "A")
			items := fx.ListAll(authority.KindPrefix(authority.ObjectActor), 2)
			require.Equal(t, sortedKeys(rows), keysOf(items))
		}},
		{"ListsReservedRows", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			items := fx.ListAll(authority.KindPrefix(authority.ObjectUserSpot), 10)
			require.Len(t, items, 1)
			RequireSameRow(t, r.Res.Creating, items[0].Snapshot)
			require.NotNil(t, items[0].Snapshot.PendingCreation)
		}},
		{"OmitsDeletedRows", func(t *testing.T, fx *Fixture) {
			rows := populate(fx, "a", "b", "c")
			key := fx.Key(authority.ObjectActor, "b")
			fx.Delete(key, rows[key].StoreVersion)
			delete(rows, key)
			require.Equal(t, sortedKeys(rows), keysOf(fx.ListAll(authority.KindPrefix(authority.ObjectActor), 1)))
		}},
		{"PrefixIsolation", func(t *testing.T, fx *Fixture) {
			actors := populate(fx, "x1", "x2")
			spot := fx.Active(authority.ObjectUserSpot, "x1", TargetA)
			fx.Active(authority.ObjectInstanceSpot, "x1", TargetA)
			require.Equal(t, sortedKeys(actors), keysOf(fx.ListAll(authority.KindPrefix(authority.ObjectActor), 1)))
			spots := fx.ListAll(authority.KindPrefix(authority.ObjectUserSpot), 1)
			require.Equal(t, []authority.Key{fx.Key(authority.ObjectUserSpot, "x1")}, keysOf(spots), "user_spot/ lists no other kind")
			RequireSameRow(t, spot, spots[0].Snapshot)
			require.Equal(t, []authority.Key{fx.Key(authority.ObjectInstanceSpot, "x1")}, keysOf(fx.ListAll(authority.KindPrefix(authority.ObjectInstanceSpot), 1)))
		}},
		{"PrefixWithinKind", func(t *testing.T, fx *Fixture) {
			populate(fx, "ab1", "ab2", "b1", "a")
			got := keysOf(fx.ListAll("actor/ab", 1))
			require.Equal(t, []authority.Key{fx.Key(authority.ObjectActor, "ab1"), fx.Key(authority.ObjectActor, "ab2")}, got)
		}},
		{"CursorOfOtherPrefixRejected", func(t *testing.T, fx *Fixture) {
			cursor := firstCursor(t, fx)
			invalid(t, fx, authority.KindPrefix(authority.ObjectUserSpot), cursor)
			invalid(t, fx, "actor/a", cursor)
		}},
		{"MalformedCursorRejected", func(t *testing.T, fx *Fixture) {
			populate(fx, "a")
			for _, c := range []authority.ScanCursor{"x", "not a cursor", "%%%%", "eyJ2IjoxfQ"} {
				invalid(t, fx, authority.KindPrefix(authority.ObjectActor), c)
			}
		}},
		{"TamperedCursorRejected", func(t *testing.T, fx *Fixture) {
			cursor := []byte(firstCursor(t, fx))
			for i := range cursor {
				tampered := slices.Clone(cursor)
				if tampered[i] == 'A' {
					tampered[i] = 'B'
				} else {
					tampered[i] = 'A'
				}
				res, err := fx.Store().ListAuthorities(fx.Ctx(), authority.KindPrefix(authority.ObjectActor), authority.ScanCursor(tampered), 1)
				if err == nil {
					// A change the codec cannot see must still name a position
					// of this listing: a page or scanExpired.
					require.Contains(t, []authority.ResultKind{authority.KindPage, authority.KindScanExpired}, res.Kind)
					continue
				}
				require.True(t, errors.Is(err, authority.ErrInvalidArgument), "byte %d: %v", i, err)
			}
		}},
		{"CursorContinuesWithoutChanges", func(t *testing.T, fx *Fixture) {
			rows := populate(fx, "a", "b", "c")
			prefix := authority.KindPrefix(authority.ObjectActor)
			first := list(t, fx, prefix, "", 1)
			// Writes to other prefixes do not disturb a listing's content.
			fx.Active(authority.ObjectUserSpot, "s1", TargetA)
			var got []authority.ScanItem
			got = append(got, first.Items...)
			for cursor := first.NextCursor; cursor != ""; {
				res := list(t, fx, prefix, cursor, 1)
				if res.Kind == authority.KindScanExpired {
					t.Skip("provider expires listings on any write")
				}
				got = append(got, res.Items...)
				cursor = res.NextCursor
			}
			require.Equal(t, sortedKeys(rows), keysOf(got))
		}},
		{"MidScanInsertAhead", midScan(func(t *testing.T, fx *Fixture, _ map[authority.Key]*authority.Snapshot) {
			fx.Active(authority.ObjectActor, "cc", TargetA)
		})},
		{"MidScanInsertBehind", midScan(func(t *testing.T, fx *Fixture, _ map[authority.Key]*authority.Snapshot) {
			fx.Active(authority.ObjectActor, "0", TargetA)
		})},
		{"MidScanReserveAhead", midScan(func(t *testing.T, fx *Fixture, _ map[authority.Key]*authority.Snapshot) {
			fx.Reserve(authority.ObjectActor, "dd", TargetA)
		})},
		{"MidScanDeleteAhead", midScan(func(t *testing.T, fx *Fixture, rows map[authority.Key]*authority.Snapshot) {
			key := fx.Key(authority.ObjectActor, "e")
			fx.Delete(key, rows[key].StoreVersion)
		})},
		{"MidScanUpdateAhead", midScan(func(t *testing.T, fx *Fixture, rows map[authority.Key]*authority.Snapshot) {
			key := fx.Key(authority.ObjectActor, "f")
			fx.Put(key, rows[key].StoreVersion, []byte("changed"))
		})},
		{"MidScanUpdateBehind", midScan(func(t *testing.T, fx *Fixture, rows map[authority.Key]*authority.Snapshot) {
			key := fx.Key(authority.ObjectActor, "a")
			fx.Put(key, rows[key].StoreVersion, []byte("changed"))
		})},
		{"MidScanRemoveAllByOwner", midScan(func(t *testing.T, fx *Fixture, _ map[authority.Key]*authority.Snapshot) {
			n, err := fx.Store().RemoveAllByOwner(fx.Ctx(), OwnerA)
			require.NoError(t, err)
			require.Equal(t, int64(6), n)
		})},
		{"MidScanAggregateMove", midScan(func(t *testing.T, fx *Fixture, rows map[authority.Key]*authority.Snapshot) {
			d, e := fx.Key(authority.ObjectActor, "d"), fx.Key(authority.ObjectActor, "e")
			req := AggregateRequest("agg-scan", 1, TargetB, authority.CapacityVector{Actors: 2},
				Participant(d, rows[d].StoreVersion, authority.TransitionNewOwner, []byte("moved")),
				Participant(e, rows[e].StoreVersion, authority.TransitionNewOwner, []byte("moved")))
			require.Equal(t, authority.KindCommitted, commitAggregateKind(t, fx, fx.MustPrepare(req)))
		})},
		{"ExpireScans", func(t *testing.T, fx *Fixture) {
			if fx.H.ExpireScans == nil {
				t.Skip("provider cannot expire scans")
			}
			cursor := firstCursor(t, fx)
			fx.H.ExpireScans(t)
			res := list(t, fx, authority.KindPrefix(authority.ObjectActor), cursor, 1)
			require.Equal(t, authority.KindScanExpired, res.Kind)
			require.Empty(t, res.Items)
			// A new listing works.
			require.Len(t, fx.ListAll(authority.KindPrefix(authority.ObjectActor), 1), 3)
		}},
	})
}
