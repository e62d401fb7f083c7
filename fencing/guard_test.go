package fencing_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/fencing"
)

// newGuard makes a guard on a fresh fence table, and a "data" table standing
// for the caller's own rows.
func newGuard(t *testing.T, db *sql.DB) (*fencing.Guard, string) {
	t.Helper()
	ctx := context.Background()
	g, err := fencing.NewGuard(fencing.PostgreSQL, tableFor(t, "fence"))
	require.NoError(t, err)
	require.NoError(t, g.Init(ctx, db))
	data := tableFor(t, "data")
	_, err = db.ExecContext(ctx, `CREATE TABLE `+data+` (id serial PRIMARY KEY, object text NOT NULL, token bigint NOT NULL)`)
	require.NoError(t, err)
	return g, data
}

// write runs one guarded transaction: Check, then the caller's own insert.
func write(ctx context.Context, db *sql.DB, g *fencing.Guard, data, object string, token fencing.Token) error {
	tx, err := db.BeginTx(ctx, nil)
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

func rows(t *testing.T, db *sql.DB, data, object string) []int64 {
	t.Helper()
	r, err := db.QueryContext(context.Background(), `SELECT token FROM `+data+` WHERE object = $1 ORDER BY id`, object)
	require.NoError(t, err)
	defer r.Close()
	var out []int64
	for r.Next() {
		var tok int64
		require.NoError(t, r.Scan(&tok))
		out = append(out, tok)
	}
	require.NoError(t, r.Err())
	return out
}

func TestCheckAcceptsEqualAndHigherTokens(t *testing.T) {
	db := openDB(t)
	ctx := context.Background()
	g, data := newGuard(t, db)

	for _, tok := range []fencing.Token{3, 3, 4, 9, 9} {
		require.NoError(t, write(ctx, db, g, data, "actor/a", tok), "token %d", tok)
	}
	require.Equal(t, []int64{3, 3, 4, 9, 9}, rows(t, db, data, "actor/a"))
	highest, err := g.Highest(ctx, db, "actor/a")
	require.NoError(t, err)
	require.Equal(t, fencing.Token(9), highest)

	// Tokens of another object are unrelated: a low token is fine there.
	require.NoError(t, write(ctx, db, g, data, "actor/b", 1))
	highest, err = g.Highest(ctx, db, "actor/b")
	require.NoError(t, err)
	require.Equal(t, fencing.Token(1), highest)
	highest, err = g.Highest(ctx, db, "actor/never")
	require.NoError(t, err)
	require.Equal(t, fencing.Token(0), highest)
}

// TestCheckRefusesLowerTokenAndRollsBack: the caller's write made before
// Check in the same transaction never becomes visible, and the transaction
// cannot be committed or written to any more.
func TestCheckRefusesLowerTokenAndRollsBack(t *testing.T) {
	db := openDB(t)
	ctx := context.Background()
	g, data := newGuard(t, db)
	require.NoError(t, write(ctx, db, g, data, "actor/a", 5))

	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = tx.ExecContext(ctx, `INSERT INTO `+data+` (object, token) VALUES ('actor/a', 4)`)
	require.NoError(t, err)
	err = g.Check(ctx, tx, "actor/a", 4)
	require.ErrorIs(t, err, fencing.ErrStaleToken)
	var stale *fencing.StaleTokenError
	require.ErrorAs(t, err, &stale)
	require.Equal(t, fencing.StaleTokenError{Object: "actor/a", Token: 4, Highest: 5}, *stale)
	require.Contains(t, err.Error(), "below the recorded 5")

	_, err = tx.ExecContext(ctx, `INSERT INTO `+data+` (object, token) VALUES ('actor/a', 4)`)
	require.ErrorIs(t, err, sql.ErrTxDone)
	require.ErrorIs(t, tx.Commit(), sql.ErrTxDone)

	require.Equal(t, []int64{5}, rows(t, db, data, "actor/a"), "the refused transaction's write is not visible")
	highest, err := g.Highest(ctx, db, "actor/a")
	require.NoError(t, err)
	require.Equal(t, fencing.Token(5), highest, "the refused token is not recorded")

	// Through the Verifier interface, the same.
	tx, err = db.BeginTx(ctx, nil)
	require.NoError(t, err)
	var v fencing.Verifier = g.Verifier(tx)
	require.ErrorIs(t, v.Verify(ctx, "actor/a", 1), fencing.ErrStaleToken)
	require.ErrorIs(t, tx.Commit(), sql.ErrTxDone)
	tx, err = db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, g.Verifier(tx).Verify(ctx, "actor/a", 6))
	require.NoError(t, tx.Commit())
	highest, err = g.Highest(ctx, db, "actor/a")
	require.NoError(t, err)
	require.Equal(t, fencing.Token(6), highest)
}

// TestCheckUncommittedTokenIsNotRecorded: a token checked in a transaction
// that then rolls back leaves no trace.
func TestCheckUncommittedTokenIsNotRecorded(t *testing.T) {
	db := openDB(t)
	ctx := context.Background()
	g, _ := newGuard(t, db)
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, g.Check(ctx, tx, "actor/a", 8))
	require.NoError(t, tx.Rollback())
	highest, err := g.Highest(ctx, db, "actor/a")
	require.NoError(t, err)
	require.Equal(t, fencing.Token(0), highest)
}

func TestCheckRefusesBadInput(t *testing.T) {
	db := openDB(t)
	ctx := context.Background()
	g, data := newGuard(t, db)
	require.NoError(t, write(ctx, db, g, data, "actor/a", 5))

	require.ErrorIs(t, g.Check(ctx, nil, "actor/a", 5), authority.ErrInvalidArgument)
	cases := map[string]struct {
		object string
		token  fencing.Token
	}{
		"empty object":     {"", 5},
		"NUL in object":    {"actor/\x00a", 5},
		"invalid UTF-8":    {"actor/\xff", 5},
		"over-long object": {strings.Repeat("a", fencing.MaxObjectBytes+1), 5},
		"zero token":       {"actor/a", 0},
		"negative token":   {"actor/a", -7},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			tx, err := db.BeginTx(ctx, nil)
			require.NoError(t, err)
			_, err = tx.ExecContext(ctx, `INSERT INTO `+data+` (object, token) VALUES ('actor/a', 99)`)
			require.NoError(t, err)
			require.ErrorIs(t, g.Check(ctx, tx, c.object, c.token), authority.ErrInvalidArgument)
			require.ErrorIs(t, tx.Commit(), sql.ErrTxDone, "the transaction was rolled back")
		})
	}
	// A transaction already committed: an error, nothing recorded.
	done, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, done.Commit())
	require.ErrorIs(t, g.Check(ctx, done, "actor/a", 6), sql.ErrTxDone)

	var nilGuard *fencing.Guard
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.ErrorIs(t, nilGuard.Check(ctx, tx, "actor/a", 5), authority.ErrInvalidArgument)
	require.ErrorIs(t, tx.Commit(), sql.ErrTxDone)

	require.Equal(t, []int64{5}, rows(t, db, data, "actor/a"), "no write of a refused transaction landed")
	highest, err := g.Highest(ctx, db, "actor/a")
	require.NoError(t, err)
	require.Equal(t, fencing.Token(5), highest)

	// The longest accepted key works.
	require.NoError(t, write(ctx, db, g, data, strings.Repeat("é", fencing.MaxObjectBytes/2), 1))
	var nilDB *sql.DB
	_, err = g.Highest(ctx, nilDB, "actor/a")
	require.ErrorIs(t, err, authority.ErrInvalidArgument)
	_, err = g.Highest(ctx, db, "")
	require.ErrorIs(t, err, authority.ErrInvalidArgument)
	require.ErrorIs(t, g.Init(ctx, nil), authority.ErrInvalidArgument)
}

func TestNewGuardValidatesDialectAndTable(t *testing.T) {
	for _, bad := range []string{"Fence", "1fence", "fen-ce", "a.b.c", ".fence", "fence.", `f"; DROP TABLE x; --`,
		"fence ", strings.Repeat("f", 64), "é"} {
		_, err := fencing.NewGuard(fencing.PostgreSQL, bad)
		require.ErrorIs(t, err, authority.ErrInvalidArgument, "table %q", bad)
	}
	for _, good := range []string{"", "fence", "_f1", "public.fence", strings.Repeat("f", 63)} {
		g, err := fencing.NewGuard(fencing.PostgreSQL, good)
		require.NoError(t, err, "table %q", good)
		require.Contains(t, g.Schema(), "CREATE TABLE IF NOT EXISTS")
	}
	g, err := fencing.NewGuard(fencing.PostgreSQL, "")
	require.NoError(t, err)
	require.Contains(t, g.Schema(), `"`+fencing.DefaultTable+`"`)
	_, err = fencing.NewGuard("sqlite", "fence")
	require.ErrorIs(t, err, authority.ErrInvalidArgument)
}

// TestGuardSchemaQualifiedTable: a table in a schema works end to end.
func TestGuardSchemaQualifiedTable(t *testing.T) {
	db := openDB(t)
	ctx := context.Background()
	schema := tableFor(t, "s")
	_, err := db.ExecContext(ctx, `CREATE SCHEMA `+schema)
	require.NoError(t, err)
	g, err := fencing.NewGuard(fencing.PostgreSQL, schema+".fence")
	require.NoError(t, err)
	require.NoError(t, g.Init(ctx, db))
	require.NoError(t, g.Init(ctx, db), "Init is idempotent")
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, g.Check(ctx, tx, "actor/a", 2))
	require.NoError(t, tx.Commit())
	var n int
	require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM `+schema+`.fence WHERE token = 2`).Scan(&n))
	require.Equal(t, 1, n)
}

// TestInitConcurrent: processes starting at once may all Init the same new
// table (CREATE TABLE IF NOT EXISTS alone can fail with a unique violation
// on pg_type when two run at once).
func TestInitConcurrent(t *testing.T) {
	db := openDB(t)
	ctx := context.Background()
	for round := 0; round < 5; round++ {
		g, err := fencing.NewGuard(fencing.PostgreSQL, tableFor(t, "fence"))
		require.NoError(t, err)
		var wg sync.WaitGroup
		errs := make([]error, 6)
		for i := range errs {
			wg.Add(1)
			go func() { defer wg.Done(); errs[i] = g.Init(ctx, db) }()
		}
		wg.Wait()
		require.NoError(t, errors.Join(errs...))
	}
}
