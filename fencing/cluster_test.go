package fencing_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/fencing"
)

// bound returns g bound to cluster.
func bound(t *testing.T, g *fencing.Guard, cluster string) *fencing.Guard {
	t.Helper()
	b, err := g.ForCluster(cluster)
	require.NoError(t, err)
	return b
}

// TestGuardTellsANewClusterFromAStaleWriter: tokens restart low on a new
// cluster. A bound guard names the new cluster's tokens as such instead of
// calling them stale; once the new cluster is adopted its low tokens pass,
// and a writer of the old cluster stays refused however high its token.
func TestGuardTellsANewClusterFromAStaleWriter(t *testing.T) {
	db := openDB(t)
	ctx := context.Background()
	g, data := newGuard(t, db)
	oldCluster, newCluster := bound(t, g, "cluster-a"), bound(t, g, "cluster-b")

	require.NoError(t, write(ctx, db, oldCluster, data, "actor/a", 6))
	require.NoError(t, write(ctx, db, oldCluster, data, "actor/b", 2))
	follows, err := g.Cluster(ctx, db)
	require.NoError(t, err)
	require.Equal(t, "cluster-a", follows, "the first bound Check makes the table follow its cluster")
	require.ErrorIs(t, write(ctx, db, oldCluster, data, "actor/a", 5), fencing.ErrStaleToken)

	// the new cluster's token is low: refused as of another cluster, not stale
	err = write(ctx, db, newCluster, data, "actor/a", 3)
	require.ErrorIs(t, err, fencing.ErrOtherCluster)
	require.NotErrorIs(t, err, fencing.ErrStaleToken)
	var other *fencing.OtherClusterError
	require.ErrorAs(t, err, &other)
	require.Equal(t, fencing.OtherClusterError{Object: "actor/a", Cluster: "cluster-b", Following: "cluster-a"}, *other)
	require.Contains(t, err.Error(), "Guard.Adopt")
	require.ErrorIs(t, write(ctx, db, newCluster, data, "actor/new", 1), fencing.ErrOtherCluster, "also an object without a token yet")
	require.ErrorIs(t, write(ctx, db, g, data, "actor/a", 100), fencing.ErrOtherCluster, "an unbound guard tells no cluster")

	dropped, err := g.Adopt(ctx, db, "cluster-b")
	require.NoError(t, err)
	require.Equal(t, int64(2), dropped)
	_, err = g.Adopt(ctx, db, "cluster-b")
	require.ErrorIs(t, err, authority.ErrInvalidArgument, "adopting the followed cluster would drop its own tokens")

	require.NoError(t, write(ctx, db, newCluster, data, "actor/a", 3))
	require.NoError(t, write(ctx, db, newCluster, data, "actor/new", 1))
	for _, tok := range []fencing.Token{5, 6, 7, 1 << 40} {
		require.ErrorIs(t, write(ctx, db, oldCluster, data, "actor/a", tok), fencing.ErrOtherCluster, "a writer of the replaced cluster, token %d", tok)
		require.ErrorIs(t, write(ctx, db, oldCluster, data, "actor/b", tok), fencing.ErrOtherCluster)
	}
	require.ErrorIs(t, write(ctx, db, g, data, "actor/b", 1<<40), fencing.ErrOtherCluster)
	require.ErrorIs(t, write(ctx, db, newCluster, data, "actor/a", 2), fencing.ErrStaleToken, "the new cluster's tokens compare as before")
	require.Equal(t, []int64{6, 3}, rows(t, db, data, "actor/a"))
	require.Equal(t, []int64{2}, rows(t, db, data, "actor/b"))
	highest, err := g.Highest(ctx, db, "actor/a")
	require.NoError(t, err)
	require.Equal(t, fencing.Token(3), highest)

	_, err = g.ForCluster("")
	require.ErrorIs(t, err, authority.ErrInvalidArgument)
	_, err = g.Adopt(ctx, db, "")
	require.ErrorIs(t, err, authority.ErrInvalidArgument)
}

// TestInitMigratesATableWithoutClusters: a fence table of the version before
// clusters keeps its tokens; the first bound Check makes it follow its
// cluster and compares tokens as before.
func TestInitMigratesATableWithoutClusters(t *testing.T) {
	db := openDB(t)
	ctx := context.Background()
	table := tableFor(t, "fence")
	_, err := db.ExecContext(ctx, `CREATE TABLE `+table+` (object text PRIMARY KEY, token bigint NOT NULL CHECK (token > 0))`)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, `INSERT INTO `+table+` (object, token) VALUES ('actor/a', 6), ('actor/b', 9)`)
	require.NoError(t, err)
	g, err := fencing.NewGuard(fencing.PostgreSQL, table)
	require.NoError(t, err)
	require.NoError(t, g.Init(ctx, db))
	require.NoError(t, g.Init(ctx, db), "idempotent")
	data := tableFor(t, "data")
	_, err = db.ExecContext(ctx, `CREATE TABLE `+data+` (id serial PRIMARY KEY, object text NOT NULL, token bigint NOT NULL)`)
	require.NoError(t, err)

	require.ErrorIs(t, write(ctx, db, g, data, "actor/a", 5), fencing.ErrStaleToken, "unbound, as before")
	b := bound(t, g, "cluster-a")
	require.ErrorIs(t, write(ctx, db, b, data, "actor/a", 5), fencing.ErrStaleToken, "the old tokens are kept")
	require.NoError(t, write(ctx, db, b, data, "actor/a", 7))
	follows, err := g.Cluster(ctx, db)
	require.NoError(t, err)
	require.Equal(t, "cluster-a", follows)
	highest, err := g.Highest(ctx, db, "actor/b")
	require.NoError(t, err)
	require.Equal(t, fencing.Token(9), highest)
}

// TestAdoptWaitsForChecksInFlight: Adopt waits for a Check whose transaction
// is open, and a Check of the replaced cluster after it is refused.
func TestAdoptWaitsForChecksInFlight(t *testing.T) {
	db := openDB(t)
	ctx := context.Background()
	g, data := newGuard(t, db)
	oldCluster := bound(t, g, "cluster-a")
	holder, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer holder.Rollback()
	require.NoError(t, oldCluster.Check(ctx, holder, "actor/a", 4))

	done := make(chan error, 1)
	go func() { _, err := g.Adopt(ctx, db, "cluster-b"); done <- err }()
	waitForLockWaiter(t, db)
	select {
	case err := <-done:
		t.Fatalf("Adopt returned while a Check was in flight: %v", err)
	default:
	}
	require.NoError(t, holder.Commit())
	require.NoError(t, <-done)
	require.ErrorIs(t, write(ctx, db, oldCluster, data, "actor/a", 5), fencing.ErrOtherCluster)
	require.NoError(t, write(ctx, db, bound(t, g, "cluster-b"), data, "actor/a", 1))
}
