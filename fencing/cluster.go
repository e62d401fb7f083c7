package fencing

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"unicode/utf8"

	authority "github.com/zlink-systems/authority"
)

// MaxClusterBytes bounds a cluster identity ForCluster accepts.
const MaxClusterBytes = 256

// The fence table's row with the empty object key (no object has it: Check
// refuses an empty key) holds the cluster the table follows (NULL: none).
// Init creates it; Check creates it in a table that has none (one of an
// earlier version). Every Check reads it with a locking read, so under
// REPEATABLE READ and SERIALIZABLE a Check whose snapshot is older than an
// Adopt fails with a serialization failure instead of missing the Adopt.
const (
	// selectMeta locks the row shared (an unbound guard).
	selectMeta = `SELECT cluster FROM %s WHERE object = '' FOR SHARE`
	// selectFollowed locks it shared when it names a cluster (a bound
	// guard, which claims a row of no cluster with claimMeta instead, so
	// two claimers never both hold it shared and then wait for each other).
	selectFollowed = `SELECT cluster FROM %s WHERE object = '' AND cluster IS NOT NULL FOR SHARE`
	// claimMeta makes a table that follows no cluster follow $1 (a bound
	// guard); createMeta creates the row of no cluster (an unbound guard,
	// on a table of an earlier version; Init).
	claimMeta    = `INSERT INTO %s AS fence (object, token, cluster) VALUES ('', 1, $1) ON CONFLICT (object) DO UPDATE SET cluster = EXCLUDED.cluster WHERE fence.cluster IS NULL`
	createMeta   = `INSERT INTO %s (object, token, cluster) VALUES ('', 1, NULL) ON CONFLICT (object) DO NOTHING`
	lockTable    = `LOCK TABLE %s IN EXCLUSIVE MODE`
	readMeta     = `SELECT cluster FROM %s WHERE object = ''`
	dropTokens   = `DELETE FROM %s WHERE object <> ''`
	recordedMeta = `INSERT INTO %s (object, token, cluster) VALUES ('', 1, $1) ON CONFLICT (object) DO UPDATE SET cluster = EXCLUDED.cluster`
)

// ForCluster returns a copy of g bound to cluster: the identity of the
// cluster the tokens come from (for the etcd store, Store.ClusterID).
// Ownership tokens only rise within one cluster: a new cluster, a restore
// under a new cluster token, or a copy of the namespace to another cluster
// hands out low tokens again, which an unbound guard would refuse for good
// as stale.
//
// A fence table follows one cluster. A bound guard's first Check on a table
// that follows none (a new table, or one of a version before ForCluster,
// whose tokens it keeps) makes the table follow its cluster. From then on
// Check refuses a token of any other cluster, and any token of an unbound
// guard, with *OtherClusterError (ErrOtherCluster), whatever its value: a
// writer of a replaced cluster stays fenced out even though its tokens may
// be higher. When the cluster has really been replaced, Adopt makes the
// table follow the new one. An empty or over-long cluster is refused with an
// error matching authority.ErrInvalidArgument.
func (g *Guard) ForCluster(cluster string) (*Guard, error) {
	if g == nil {
		return nil, authority.Invalid("fencing: ForCluster on a nil Guard.")
	}
	if cluster == "" || len(cluster) > MaxClusterBytes || !utf8.ValidString(cluster) {
		return nil, authority.Invalid(fmt.Sprintf("fencing: cluster must be 1 to %d bytes of UTF-8.", MaxClusterBytes))
	}
	b := *g
	b.cluster = cluster
	return &b, nil
}

// checkCluster refuses a Check when the table follows another cluster than
// the guard's, and makes a table that follows none follow the guard's. It
// holds the table's cluster row (shared, or exclusive when it claimed it)
// until tx ends, so Adopt waits for the Checks in flight, the Checks after it
// see the new cluster, and a Check whose snapshot predates an Adopt's commit
// (REPEATABLE READ, SERIALIZABLE) fails with a serialization failure
// (ErrRetry) on the row Adopt changed.
func (g *Guard) checkCluster(ctx context.Context, tx *sql.Tx, object string) error {
	query := selectMeta
	if g.cluster != "" {
		query = selectFollowed
	}
	follows, found, err := g.following(ctx, tx, query)
	if err != nil {
		return err
	}
	if !found {
		// No row (a table of an earlier version) or, for a bound guard, no
		// cluster in it yet: create or claim the row. It conflicts with an Adopt
		// or claim committed after tx's snapshot (a serialization failure
		// under REPEATABLE READ and SERIALIZABLE), and locks the row.
		stmt, args := fmt.Sprintf(createMeta, g.table), []any(nil)
		if g.cluster != "" {
			stmt, args = fmt.Sprintf(claimMeta, g.table), []any{g.cluster}
		}
		if _, err := tx.ExecContext(ctx, stmt, args...); err != nil {
			return dbFailure(fmt.Sprintf("fencing: record cluster %q in %s", g.cluster, g.table), err)
		}
		if follows, _, err = g.following(ctx, tx, selectMeta); err != nil {
			return err
		}
	}
	if follows.Valid && follows.String != g.cluster {
		return &OtherClusterError{Object: object, Cluster: g.cluster, Following: follows.String}
	}
	return nil
}

// following reads (and locks shared) the cluster the table follows with
// query, and whether it found the row.
func (g *Guard) following(ctx context.Context, tx *sql.Tx, query string) (sql.NullString, bool, error) {
	var c sql.NullString
	err := tx.QueryRowContext(ctx, fmt.Sprintf(query, g.table)).Scan(&c)
	if errors.Is(err, sql.ErrNoRows) {
		return sql.NullString{}, false, nil
	}
	if err != nil {
		return c, false, dbFailure(fmt.Sprintf("fencing: read the cluster of %s", g.table), err)
	}
	return c, true, nil
}

// Cluster returns the cluster the fence table follows ("" when none).
func (g *Guard) Cluster(ctx context.Context, q Querier) (string, error) {
	if g == nil || isNil(q) {
		return "", authority.Invalid("fencing: Cluster needs a Guard and a database handle.")
	}
	var c sql.NullString
	err := q.QueryRowContext(ctx, fmt.Sprintf(readMeta, g.table)).Scan(&c)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("fencing: read the cluster of %s: %w", g.table, err)
	}
	return c.String, nil
}

// Adopt makes the fence table follow cluster, after its tokens' cluster has
// been replaced (a new cluster, a restore under a new cluster token, the
// namespace copied to another cluster). It drops every recorded token, in
// one transaction that first locks the table against every Check (waiting
// for those in flight), and returns how many it dropped.
//
// Why this is safe: from its commit on, Check refuses every token that is
// not of cluster (an unbound guard's too), so a writer that still holds a
// token of the replaced cluster, however high, can never write again, at
// any isolation level: a transaction whose snapshot predates the commit
// (REPEATABLE READ, SERIALIZABLE) fails in Check with ErrRetry, and its
// retry is refused. The new cluster's tokens rise from there, and Check
// compares them as before. Adopt itself runs at READ COMMITTED whatever the
// session's default, and reads the table only after its lock.
// What it must not be used for: adopting the cluster the recorded tokens
// came from would forget them and let that cluster's stale writers in, so
// Adopt refuses (ErrInvalidArgument) when the table already follows
// cluster. On a table that follows no cluster, make sure its tokens are of
// another cluster; otherwise leave it to the first bound Check, which keeps
// them.
func (g *Guard) Adopt(ctx context.Context, db *sql.DB, cluster string) (int64, error) {
	b, err := g.ForCluster(cluster)
	if err != nil {
		return 0, err
	}
	if db == nil {
		return 0, authority.Invalid("fencing: Adopt needs a *sql.DB.")
	}
	// READ COMMITTED whatever the session's default: Adopt reads the table
	// only after its lock, so it sees every Check that committed before it.
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return 0, fmt.Errorf("fencing: adopt in %s: %w", g.table, err)
	}
	defer tx.Rollback() // after Commit: a no-op
	if _, err := tx.ExecContext(ctx, fmt.Sprintf(lockTable, g.table)); err != nil {
		return 0, fmt.Errorf("fencing: adopt in %s: %w", g.table, err)
	}
	if follows, err := b.Cluster(ctx, tx); err != nil {
		return 0, err
	} else if follows == cluster {
		return 0, authority.Invalid(fmt.Sprintf("fencing: %s already follows cluster %q: adopting it would drop its own tokens.", g.table, cluster))
	}
	res, err := tx.ExecContext(ctx, fmt.Sprintf(dropTokens, g.table))
	if err != nil {
		return 0, fmt.Errorf("fencing: adopt in %s: %w", g.table, err)
	}
	dropped, _ := res.RowsAffected()
	if _, err := tx.ExecContext(ctx, fmt.Sprintf(recordedMeta, g.table), cluster); err != nil {
		return 0, fmt.Errorf("fencing: adopt in %s: %w", g.table, err)
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("fencing: adopt in %s: %w", g.table, err)
	}
	return dropped, nil
}
