package fencing_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/fencing"
)

// isolationLevels are the levels a caller may run its guarded transactions
// at.
var isolationLevels = []sql.IsolationLevel{sql.LevelReadCommitted, sql.LevelRepeatableRead, sql.LevelSerializable}

// racesPerCase is how many times each race runs, so an outcome is not a
// fluke of one interleaving.
const racesPerCase = 3

// fenceTable says how a race's fence table comes to be.
type fenceTable int

const (
	tableOfInit      fenceTable = iota // created by Init
	tableOfMigration                   // created by an earlier version (no cluster row), never bound
	tableOfClusterA                    // followed cluster-a (a bound Check) before the race
)

func (f fenceTable) String() string {
	return [...]string{"init", "earlier-version", "bound"}[f]
}

// TestAdoptFencesWritersAtEveryIsolationLevel: from Adopt's commit on, no
// writer of the replaced cluster commits, whatever its token and the
// isolation level of its transaction. The writer's transaction starts while
// Adopt waits for an open Check (its snapshot is older than Adopt's commit),
// or reads before Adopt runs at all; it then Checks a token far above the
// recorded one and, if allowed, writes and commits. It must be refused with
// ErrOtherCluster (READ COMMITTED) or fail in Check with ErrRetry (REPEATABLE
// READ, SERIALIZABLE: the snapshot predates Adopt), and its retry, as the caller
// runs it, is refused with ErrOtherCluster. Each level, each kind of table
// (one Init made, one of an earlier version, one a bound guard claimed), each
// kind of writer, several times.
func TestAdoptFencesWritersAtEveryIsolationLevel(t *testing.T) {
	db := openDB(t)
	for _, iso := range isolationLevels {
		for _, table := range []fenceTable{tableOfInit, tableOfMigration, tableOfClusterA} {
			for _, early := range []bool{false, true} {
				name := fmt.Sprintf("%v/%v/waits-behind-adopt", iso, table)
				if early {
					name = fmt.Sprintf("%v/%v/snapshot-before-adopt", iso, table)
				}
				t.Run(name, func(t *testing.T) {
					for range racesPerCase {
						raceAdopt(t, db, iso, table, early)
					}
				})
			}
		}
	}
}

// adoptRace is one race's fence table, the writer's guard and the caller's
// data table.
type adoptRace struct {
	guard, writer *fencing.Guard
	table, data   string
}

// newAdoptRace makes the race's fence table of the given kind, with a token
// of 5 recorded for actor/a by the writer's guard.
func newAdoptRace(t *testing.T, db *sql.DB, kind fenceTable) adoptRace {
	t.Helper()
	ctx := context.Background()
	r := adoptRace{table: tableFor(t, "fence"), data: tableFor(t, "data")}
	var err error
	r.guard, err = fencing.NewGuard(fencing.PostgreSQL, r.table)
	require.NoError(t, err)
	if kind == tableOfMigration {
		// the table as the version before this one created it
		_, err = db.ExecContext(ctx, `CREATE TABLE `+r.table+` (object text PRIMARY KEY, token bigint NOT NULL CHECK (token > 0), cluster text)`)
	} else {
		err = r.guard.Init(ctx, db)
	}
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, `CREATE TABLE `+r.data+` (id serial PRIMARY KEY, object text NOT NULL, token bigint NOT NULL)`)
	require.NoError(t, err)
	r.writer = r.guard
	if kind == tableOfClusterA {
		r.writer = bound(t, r.guard, "cluster-a")
	}
	require.NoError(t, write(ctx, db, r.writer, r.data, "actor/a", 5))
	return r
}

// raceAdopt runs one race of a writer of the replaced cluster against
// Adopt(cluster-b); see TestAdoptFencesWritersAtEveryIsolationLevel.
func raceAdopt(t *testing.T, db *sql.DB, iso sql.IsolationLevel, kind fenceTable, early bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := newAdoptRace(t, db, kind)
	conn, err := db.Conn(ctx)
	require.NoError(t, err)
	defer conn.Close()
	writerPID := backendPID(t, conn)
	writer, err := conn.BeginTx(ctx, &sql.TxOptions{Isolation: iso})
	require.NoError(t, err)
	defer writer.Rollback()
	if early { // the writer's snapshot is taken before Adopt starts
		_, err = writer.ExecContext(ctx, `SELECT count(*) FROM `+r.data)
		require.NoError(t, err)
	}

	// An open Check holds Adopt back.
	holder, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer holder.Rollback()
	require.NoError(t, r.writer.Check(ctx, holder, "actor/holder", 1))
	adopted := make(chan error, 1)
	go func() { _, err := r.guard.Adopt(ctx, db, "cluster-b"); adopted <- err }()
	waitForLockWaiters(t, db, r.table, 1)

	checked := make(chan error, 1)
	if early {
		require.NoError(t, holder.Commit())
		require.NoError(t, <-adopted)
		checked <- r.writer.Check(ctx, writer, "actor/a", 100)
	} else {
		// The writer starts while Adopt waits: its Check queues behind it.
		go func() { checked <- r.writer.Check(ctx, writer, "actor/a", 100) }()
		waitForBackendWaiting(t, db, writerPID)
		require.NoError(t, holder.Commit())
		require.NoError(t, <-adopted)
	}
	err = finish(ctx, writer, <-checked, r.data, "actor/a", 100)
	require.Error(t, err, "%v: a writer of the replaced cluster committed token 100 after Adopt", iso)
	if iso == sql.LevelReadCommitted {
		require.ErrorIs(t, err, fencing.ErrOtherCluster)
	} else { // the writer's snapshot predates Adopt
		require.ErrorIs(t, err, fencing.ErrRetry)
		require.True(t, serializationFailure(err), "the driver's error is kept: %v", err)
	}
	require.ErrorIs(t, writer.Commit(), sql.ErrTxDone, "Check rolled the writer back")
	require.Equal(t, []int64{5}, rows(t, db, r.data, "actor/a"), "the writer's effect is not visible")
	highest, err := r.guard.Highest(ctx, db, "actor/a")
	require.NoError(t, err)
	require.Zero(t, highest, "no token of the replaced cluster is recorded after Adopt")

	// The caller retries: refused for good; the new cluster's low tokens pass.
	require.ErrorIs(t, writeAt(ctx, db, iso, r.writer, r.data, "actor/a", 100), fencing.ErrOtherCluster)
	require.NoError(t, writeAt(ctx, db, iso, bound(t, r.guard, "cluster-b"), r.data, "actor/a", 1))
}

// TestCheckRacesAHigherTokenAtEveryIsolationLevel: a Check with a lower
// token whose transaction started before a higher token's Check committed
// never commits: it waits for the object's fence row, then is refused as
// stale (READ COMMITTED) or fails with ErrRetry (REPEATABLE READ,
// SERIALIZABLE), and its retry is refused as stale. With and without a
// fence row for the object before the race.
func TestCheckRacesAHigherTokenAtEveryIsolationLevel(t *testing.T) {
	db := openDB(t)
	for _, iso := range isolationLevels {
		for _, recorded := range []bool{false, true} {
			t.Run(fmt.Sprintf("%v/recorded=%v", iso, recorded), func(t *testing.T) {
				for range racesPerCase {
					raceCheck(t, db, iso, recorded)
				}
			})
		}
	}
}

func raceCheck(t *testing.T, db *sql.DB, iso sql.IsolationLevel, recorded bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	g, data := newGuard(t, db)
	if recorded {
		require.NoError(t, write(ctx, db, g, data, "actor/a", 3))
	}
	conn, err := db.Conn(ctx)
	require.NoError(t, err)
	defer conn.Close()
	lowerPID := backendPID(t, conn)
	lower, err := conn.BeginTx(ctx, &sql.TxOptions{Isolation: iso})
	require.NoError(t, err)
	defer lower.Rollback()
	_, err = lower.ExecContext(ctx, `SELECT count(*) FROM `+data) // its snapshot
	require.NoError(t, err)

	higher, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: iso})
	require.NoError(t, err)
	defer higher.Rollback()
	require.NoError(t, g.Check(ctx, higher, "actor/a", 9))
	checked := make(chan error, 1)
	go func() { checked <- g.Check(ctx, lower, "actor/a", 7) }()
	waitForBackendWaiting(t, db, lowerPID)
	_, err = higher.ExecContext(ctx, `INSERT INTO `+data+` (object, token) VALUES ('actor/a', 9)`)
	require.NoError(t, err)
	require.NoError(t, higher.Commit())

	err = finish(ctx, lower, <-checked, data, "actor/a", 7)
	require.Error(t, err, "%v: token 7 committed after token 9", iso)
	if iso == sql.LevelReadCommitted {
		require.ErrorIs(t, err, fencing.ErrStaleToken)
	} else { // its snapshot predates token 9's commit
		require.ErrorIs(t, err, fencing.ErrRetry)
	}
	require.ErrorIs(t, writeAt(ctx, db, iso, g, data, "actor/a", 7), fencing.ErrStaleToken, "the retry")
	want := []int64{9}
	if recorded {
		want = []int64{3, 9}
	}
	require.Equal(t, want, rows(t, db, data, "actor/a"))
}

// TestConcurrentAdoptsOneWins: two Adopts of the same cluster at once, in
// sessions whose default isolation is each level: one adopts, the other is
// refused (the table already follows the cluster) and drops nothing.
func TestConcurrentAdoptsOneWins(t *testing.T) {
	for _, level := range []string{"read committed", "repeatable read", "serializable"} {
		t.Run(level, func(t *testing.T) {
			db := openDBWith(t, "default_transaction_isolation='"+level+"'")
			ctx := context.Background()
			for range racesPerCase {
				r := newAdoptRace(t, db, tableOfClusterA)
				holder, err := db.BeginTx(ctx, nil)
				require.NoError(t, err)
				require.NoError(t, r.writer.Check(ctx, holder, "actor/holder", 1))
				var wg sync.WaitGroup
				results := make([]error, 2)
				dropped := make([]int64, 2)
				for i := range results {
					wg.Go(func() { dropped[i], results[i] = r.guard.Adopt(ctx, db, "cluster-b") })
				}
				waitForLockWaiters(t, db, r.table, 2)
				require.NoError(t, holder.Commit())
				wg.Wait()
				if results[0] != nil {
					results[0], results[1] = results[1], results[0]
					dropped[0], dropped[1] = dropped[1], dropped[0]
				}
				require.NoError(t, results[0])
				require.Equal(t, int64(2), dropped[0], "actor/a and actor/holder")
				require.ErrorIs(t, results[1], authority.ErrInvalidArgument)
				require.Zero(t, dropped[1])
				require.ErrorIs(t, write(ctx, db, r.writer, r.data, "actor/a", 100), fencing.ErrOtherCluster)
			}
		})
	}
}

// finish completes a guarded transaction whose Check returned checked: on
// success, the caller's insert and the commit. It returns the first error.
func finish(ctx context.Context, tx *sql.Tx, checked error, data, object string, token fencing.Token) error {
	if checked != nil {
		return checked
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO `+data+` (object, token) VALUES ($1, $2)`, object, int64(token)); err != nil {
		return fmt.Errorf("insert after a successful Check: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit after a successful Check: %w", err)
	}
	return nil
}

// writeAt is write at isolation level iso.
func writeAt(ctx context.Context, db *sql.DB, iso sql.IsolationLevel, g *fencing.Guard, data, object string, token fencing.Token) error {
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: iso})
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := g.Check(ctx, tx, object, token); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO `+data+` (object, token) VALUES ($1, $2)`, object, int64(token)); err != nil {
		return err
	}
	return tx.Commit()
}

// backendPID returns the server process id of conn's session.
func backendPID(t *testing.T, conn *sql.Conn) int {
	t.Helper()
	var pid int
	require.NoError(t, conn.QueryRowContext(context.Background(), `SELECT pg_backend_pid()`).Scan(&pid))
	return pid
}

// waitForBackendWaiting waits until the backend pid waits on a lock.
func waitForBackendWaiting(t *testing.T, db *sql.DB, pid int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		require.NoError(t, db.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'`, pid).Scan(&n))
		if n > 0 {
			return
		}
		require.True(t, time.Now().Before(deadline), "backend %d never waited on a lock", pid)
		time.Sleep(5 * time.Millisecond)
	}
}

// waitForLockWaiters waits until at least n backends wait on a lock in a
// statement naming table.
func waitForLockWaiters(t *testing.T, db *sql.DB, table string, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting int
		require.NoError(t, db.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() `+
			`AND wait_event_type = 'Lock' AND strpos(query, $1) > 0`, table).Scan(&waiting))
		if waiting >= n {
			return
		}
		require.True(t, time.Now().Before(deadline), "%d of %d backends wait on a lock of %s", waiting, n, table)
		time.Sleep(5 * time.Millisecond)
	}
}

// openDBWith is openDB with the session settings params ("name=value ...").
func openDBWith(tb testing.TB, params string) *sql.DB {
	tb.Helper()
	if server == nil {
		tb.Skip(skipReason)
	}
	db, err := sql.Open("pgx", dsn+" "+params)
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = db.Close() })
	return db
}

// TestChecksClaimATableAtOnce: bound and unbound Checks that start at once on
// a table that follows no cluster (its cluster row, which Init made, names
// none) all pass at READ COMMITTED: the bound ones claim the row one at a
// time (no two hold it shared and then wait for each other, a deadlock), and
// the table follows their cluster. At the other levels a Check fails only
// with ErrRetry (SERIALIZABLE: the caller's insert or commit with 40001 too),
// and a retry passes.
func TestChecksClaimATableAtOnce(t *testing.T) {
	const sessions = 6
	db := openDB(t)
	db.SetMaxOpenConns(sessions + 2)
	for _, iso := range isolationLevels {
		t.Run(iso.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			for range racesPerCase {
				g, data := newGuard(t, db)
				a := bound(t, g, "cluster-a")
				// Each session opens its transaction and takes its snapshot;
				// a lock on the data table holds all Checks until every
				// session is ready, then they go at once.
				gate, err := db.BeginTx(ctx, nil)
				require.NoError(t, err)
				_, err = gate.ExecContext(ctx, `LOCK TABLE `+data+` IN EXCLUSIVE MODE`)
				require.NoError(t, err)
				var wg sync.WaitGroup
				errs := make([]error, sessions)
				for i := range sessions {
					guard := a
					if i%3 == 2 {
						guard = g // unbound: passes while the table follows none, refused after
					}
					wg.Go(func() {
						object := fmt.Sprintf("actor/%d", i)
						for attempt := 0; attempt < 100; attempt++ {
							errs[i] = claimAtOnce(ctx, db, iso, guard, data, object)
							// Check's lost conflicts, and SERIALIZABLE's on the
							// caller's own insert and commit
							retry := errors.Is(errs[i], fencing.ErrRetry) || serializationFailure(errs[i])
							if !retry || iso == sql.LevelReadCommitted { // nothing to retry there
								return
							}
						}
					})
				}
				waitForLockWaiters(t, db, data, sessions)
				require.NoError(t, gate.Commit())
				wg.Wait()
				for i, err := range errs {
					if i%3 == 2 {
						if err != nil {
							require.ErrorIs(t, err, fencing.ErrOtherCluster, "unbound session %d", i)
						}
						continue
					}
					require.NoError(t, err, "bound session %d", i)
				}
				follows, err := g.Cluster(ctx, db)
				require.NoError(t, err)
				require.Equal(t, "cluster-a", follows)
			}
		})
	}
}

// claimAtOnce runs a transaction at iso that waits at the data table's gate
// (its snapshot taken before), then Checks object with token 1 and commits.
func claimAtOnce(ctx context.Context, db *sql.DB, iso sql.IsolationLevel, g *fencing.Guard, data, object string) error {
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: iso})
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `SELECT 1 FROM `+data+` FOR SHARE`); err != nil {
		return err
	}
	return finish(ctx, tx, g.Check(ctx, tx, object, 1), data, object, 1)
}
