package sharded_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/provider/sharded"
)

// TestListingMergesShardsInKeyOrder: rows of every shard list in one key
// order at every page size, with one cursor, equal to reading each row; a
// row written in any shard after the first page is not in the listing (each
// shard continues at its first page's revision).
func TestListingMergesShardsInKeyOrder(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, clusterCount, sharded.Config{})
	fx := conformance.NewFixture(t, harnessFor(s, nil))
	var want []authority.Key
	perShard := make([]int, clusterCount)
	for i := range 40 {
		id := fmt.Sprintf("row-%02d", i)
		fx.Active(authority.ObjectUserSpot, id, conformance.TargetA)
		key := fx.Key(authority.ObjectUserSpot, id)
		want = append(want, key)
		perShard[s.ShardOf(key)]++
	}
	fx.Active(authority.ObjectActor, "other-kind", conformance.TargetA)
	for i, n := range perShard {
		require.NotZero(t, n, "no row in shard %d: the test needs rows in every shard", i)
	}
	for _, limit := range []int{1, 2, 3, 7, 40, 1000} {
		items := fx.ListAll(authority.KindPrefix(authority.ObjectUserSpot), limit)
		got := make([]authority.Key, len(items))
		for i, it := range items {
			got[i] = it.Key
			conformance.RequireSameRow(t, fx.MustRow(it.Key), it.Snapshot)
		}
		require.Equal(t, want, got, "limit %d", limit)
	}
	page, err := s.ListAuthorities(ctx, authority.KindPrefix(authority.ObjectUserSpot), "", 5)
	require.NoError(t, err)
	require.NotEmpty(t, page.NextCursor)
	for i := range 12 { // rows written after the first page, in every shard
		fx.Active(authority.ObjectUserSpot, fmt.Sprintf("row-%02d-late", i), conformance.TargetA)
	}
	seen := len(page.Items)
	for cursor := page.NextCursor; cursor != ""; {
		next, err := s.ListAuthorities(ctx, authority.KindPrefix(authority.ObjectUserSpot), cursor, 5)
		require.NoError(t, err)
		require.Equal(t, authority.KindPage, next.Kind)
		for _, it := range next.Items {
			require.NotContains(t, string(it.Key), "late", "a row written after the first page is in the listing")
		}
		seen += len(next.Items)
		cursor = next.NextCursor
	}
	require.Equal(t, len(want), seen)
}

// TestListingCursorIsChecked: a cursor that is not one of this store's for
// this prefix (another prefix, another store's, a vector of another length,
// a revision that is not a revision, garbage) is ErrInvalidArgument.
func TestListingCursorIsChecked(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, clusterCount, sharded.Config{})
	other := newStore(t, clusterCount, sharded.Config{})
	fx := conformance.NewFixture(t, harnessFor(s, nil))
	ofx := conformance.NewFixture(t, harnessFor(other, nil))
	for i := range 9 {
		fx.Active(authority.ObjectActor, fmt.Sprintf("a-%d", i), conformance.TargetA)
		ofx.Active(authority.ObjectActor, fmt.Sprintf("a-%d", i), conformance.TargetA)
	}
	page, err := s.ListAuthorities(ctx, "actor/", "", 2)
	require.NoError(t, err)
	otherPage, err := other.ListAuthorities(ctx, "actor/", "", 2)
	require.NoError(t, err)
	vector := func(v string) authority.ScanCursor { return withVector(t, page.NextCursor, v) }
	_, err = s.ListAuthorities(ctx, "actor/", vector(cursorVector(t, page.NextCursor)), 2)
	require.NoError(t, err, "the cursor rebuilt as it was")
	for name, c := range map[string]authority.ScanCursor{
		"other store":   otherPage.NextCursor,
		"short vector":  vector("5,5"),
		"long vector":   vector("5,5,5,5"),
		"not a number":  vector("5,x,5"),
		"zero revision": vector("5,0,5"),
		"plus sign":     vector("5,+5,5"),
		"future":        vector("5,999999999,5"),
		"all done":      vector("-1,-1,-1"),
		"garbage":       "not-a-cursor",
	} {
		_, err := s.ListAuthorities(ctx, "actor/", c, 2)
		require.ErrorIs(t, err, authority.ErrInvalidArgument, name)
	}
	_, err = s.ListAuthorities(ctx, "user_spot/", page.NextCursor, 2)
	require.ErrorIs(t, err, authority.ErrInvalidArgument, "another prefix")
}

// cursorVector returns the per-shard vector a sharded cursor carries.
func cursorVector(t testing.TB, c authority.ScanCursor) string {
	t.Helper()
	p, err := authority.ParseScanCursor(c)
	require.NoError(t, err)
	return p.Scope[strings.LastIndexByte(p.Scope, '|')+1:]
}

// withVector returns c with its per-shard vector replaced by v.
func withVector(t testing.TB, c authority.ScanCursor, v string) authority.ScanCursor {
	t.Helper()
	p, err := authority.ParseScanCursor(c)
	require.NoError(t, err)
	p.Scope = p.Scope[:strings.LastIndexByte(p.Scope, '|')+1] + v
	return authority.EncodeScanCursor(p)
}

// TestListingExpiresWhenAShardCompacts: compaction in the shards passes a
// listing's revisions: the next page is KindScanExpired, never torn.
func TestListingExpiresWhenAShardCompacts(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, clusterCount, sharded.Config{})
	fx := conformance.NewFixture(t, harnessFor(s, nil))
	for i := range 12 {
		fx.Active(authority.ObjectActor, fmt.Sprintf("c-%d", i), conformance.TargetA)
	}
	page, err := s.ListAuthorities(ctx, "actor/", "", 2)
	require.NoError(t, err)
	for i := range clusterCount { // a write in every shard, so each revision moves past the listing's
		_, id := keyInShard(t, s, i, "moves")
		fx.Active(authority.ObjectActor, id, conformance.TargetA)
	}
	compactAll(t)
	res, err := s.ListAuthorities(ctx, "actor/", page.NextCursor, 2)
	require.NoError(t, err)
	require.Equal(t, authority.KindScanExpired, res.Kind)
}
