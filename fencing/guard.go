package fencing

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"

	authority "github.com/zlink-systems/authority"
)

// Dialect names the SQL a Guard speaks.
type Dialect string

// The dialects a Guard supports.
const (
	// PostgreSQL is PostgreSQL 9.6 or later (ADD COLUMN IF NOT EXISTS) through any database/sql driver
	// (tested with github.com/jackc/pgx/v5/stdlib).
	PostgreSQL Dialect = "postgresql"
)

// MaxObjectBytes bounds an object key a Guard records (PostgreSQL cannot
// index much longer text).
const MaxObjectBytes = 2048

// DefaultTable is the fence table name used when NewGuard gets "".
const DefaultTable = "authority_fence"

// tableName is a table name a Guard accepts: an optional schema and a table,
// each a lower-case SQL identifier of at most 63 bytes.
var tableName = regexp.MustCompile(`^([a-z_][a-z0-9_]{0,62}\.)?[a-z_][a-z0-9_]{0,62}$`)

// Guard makes a SQL database enforce ownership tokens: Check, inside the
// caller's own transaction, records the highest token seen for an object in
// a fence table and refuses a lower one, so a write by a replaced owner is
// never committed. A Guard is immutable and safe for concurrent use.
type Guard struct {
	dialect Dialect
	table   string   // validated and quoted
	schema  []string // CREATE TABLE and the migration of an older table
	upsert  string   // records a token, returns the highest
	highest string   // reads the highest token
	// cluster is the token source's cluster the guard is bound to
	// (ForCluster; "": none).
	cluster string
}

// NewGuard returns a Guard keeping its fence in table ("" for DefaultTable):
// an optional schema and a table name, each lower-case letters, digits and
// '_' (not starting with a digit, at most 63 bytes). A bad dialect or name is
// refused with an error matching authority.ErrInvalidArgument.
func NewGuard(dialect Dialect, table string) (*Guard, error) {
	if dialect != PostgreSQL {
		return nil, authority.Invalid(fmt.Sprintf("fencing: unsupported SQL dialect %q (supported: %q).", dialect, PostgreSQL))
	}
	if table == "" {
		table = DefaultTable
	}
	if !tableName.MatchString(table) {
		return nil, authority.Invalid(fmt.Sprintf("fencing: fence table name %q must be [schema.]table, "+
			"each lower-case letters, digits and '_', not starting with a digit, at most 63 bytes.", table))
	}
	q := `"` + strings.ReplaceAll(table, ".", `"."`) + `"`
	return &Guard{
		dialect: dialect,
		table:   q,
		schema: []string{
			`CREATE TABLE IF NOT EXISTS ` + q + ` (object text PRIMARY KEY, token bigint NOT NULL CHECK (token > 0), cluster text)`,
			// a table of a version before ForCluster: its rows keep their
			// tokens and get no cluster
			`ALTER TABLE ` + q + ` ADD COLUMN IF NOT EXISTS cluster text`,
			// the row of the cluster the table follows (none yet), which
			// every Check reads with a locking read
			fmt.Sprintf(createMeta, q),
		},
		// One statement, race-free under concurrency: the upsert locks the
		// object's fence row (the newest committed version, even in READ
		// COMMITTED) until the transaction ends, and keeps the greater
		// token; the caller compares the result with its own.
		upsert: `INSERT INTO ` + q + ` AS fence (object, token, cluster) VALUES ($1, $2, NULLIF($3, '')) ` +
			`ON CONFLICT (object) DO UPDATE SET token = GREATEST(fence.token, EXCLUDED.token), cluster = EXCLUDED.cluster RETURNING token`,
		highest: `SELECT token FROM ` + q + ` WHERE object = $1`,
	}, nil
}

// Schema returns the statements creating the fence table and its cluster
// row, or adding the cluster column and row to a table of an earlier version
// (idempotent; separated by ";\n"), for a migration tool; Init runs them.
func (g *Guard) Schema() string { return strings.Join(g.schema, ";\n") }

// Init creates the fence table if it does not exist, and its cluster row
// (following no cluster) if it has none. Concurrent Inits (one
// per process starting) are serialised by a transaction-scoped advisory lock.
func (g *Guard) Init(ctx context.Context, db *sql.DB) error {
	if g == nil || db == nil {
		return authority.Invalid("fencing: Init needs a Guard and a *sql.DB.")
	}
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return fmt.Errorf("fencing: init %s: %w", g.table, err)
	}
	defer tx.Rollback() // after Commit: a no-op returning sql.ErrTxDone
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, "authority-fence:"+g.table); err != nil {
		return fmt.Errorf("fencing: init %s: %w", g.table, err)
	}
	for _, stmt := range g.schema {
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("fencing: init %s: %w", g.table, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("fencing: init %s: %w", g.table, err)
	}
	return nil
}

// Check fences the caller's transaction tx on token for object: it records
// token as the object's highest when it is at least the highest recorded,
// and returns nil; the object's fence row then stays locked until tx ends, so
// transactions of one object pass Check one at a time and a lower token can
// never commit after a higher one. Call it before the transaction's guarded
// writes, and commit tx as usual.
//
// A guard bound to a cluster (ForCluster) first checks that the table
// follows that cluster (claiming a table that follows none); see ForCluster.
//
// When Check returns an error it has rolled tx back (tx.Commit then returns
// sql.ErrTxDone), so the guarded writes can never commit by mistake:
//   - a token lower than the recorded one: *StaleTokenError (ErrStaleToken);
//   - a token of another cluster than the one the table follows:
//     *OtherClusterError (ErrOtherCluster);
//   - bad input (nil tx, empty or over-long object key, token <= 0): an
//     error matching authority.ErrInvalidArgument;
//   - under REPEATABLE READ or SERIALIZABLE, a fence that changed after the
//     transaction's snapshot was taken (another Check of object committed,
//     or Adopt): an error matching ErrRetry and wrapping the driver's
//     serialization failure (SQLSTATE 40001); a deadlock (40P01) also
//     matches ErrRetry. Run the whole transaction again. READ COMMITTED
//     waits instead and needs no retry (see the package doc, Isolation
//     levels);
//   - any other database error, returned wrapped.
func (g *Guard) Check(ctx context.Context, tx *sql.Tx, object string, token Token) error {
	if tx == nil {
		return authority.Invalid("fencing: Check needs a transaction.")
	}
	if g == nil {
		return abandon(tx, authority.Invalid("fencing: Check on a nil Guard."))
	}
	if err := validate(object, token); err != nil {
		return abandon(tx, err)
	}
	if err := g.checkCluster(ctx, tx, object); err != nil {
		return abandon(tx, err)
	}
	var highest Token
	if err := tx.QueryRowContext(ctx, g.upsert, object, int64(token), g.cluster).Scan(&highest); err != nil {
		return abandon(tx, dbFailure(fmt.Sprintf("fencing: record token %d of %q in %s", token, object, g.table), err))
	}
	if highest > token {
		return abandon(tx, &StaleTokenError{Object: object, Token: token, Highest: highest})
	}
	return nil
}

// Verifier returns the Verifier that checks tokens inside tx (Check).
func (g *Guard) Verifier(tx *sql.Tx) Verifier { return txVerifier{guard: g, tx: tx} }

type txVerifier struct {
	guard *Guard
	tx    *sql.Tx
}

func (v txVerifier) Verify(ctx context.Context, object string, token Token) error {
	return v.guard.Check(ctx, v.tx, object, token)
}

// Querier is what Highest reads with: *sql.DB, *sql.Tx or *sql.Conn.
type Querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Highest returns the highest token recorded for object, or 0 when none is.
func (g *Guard) Highest(ctx context.Context, q Querier, object string) (Token, error) {
	if g == nil || isNil(q) {
		return 0, authority.Invalid("fencing: Highest needs a Guard and a database handle.")
	}
	if err := validateObject(object); err != nil {
		return 0, err
	}
	var t Token
	err := q.QueryRowContext(ctx, g.highest, object).Scan(&t)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("fencing: read token of %q in %s: %w", object, g.table, err)
	}
	return t, nil
}

// isNil reports a nil Querier, including a nil *sql.DB, *sql.Tx or *sql.Conn
// (whose methods would panic).
func isNil(q Querier) bool {
	switch v := q.(type) {
	case nil:
		return true
	case *sql.DB:
		return v == nil
	case *sql.Tx:
		return v == nil
	case *sql.Conn:
		return v == nil
	}
	return false
}

func validate(object string, token Token) error {
	if err := validateObject(object); err != nil {
		return err
	}
	if !token.Valid() {
		return authority.Invalid(fmt.Sprintf("fencing: ownership token must be positive, got %d.", token))
	}
	return nil
}

func validateObject(object string) error {
	if err := authority.RequireText(object, "fencing: object key"); err != nil {
		return err
	}
	if len(object) > MaxObjectBytes || !utf8.ValidString(object) {
		return authority.Invalid(fmt.Sprintf("fencing: object key must be at most %d bytes.", MaxObjectBytes))
	}
	return nil
}

// dbFailure wraps err, the failure of a statement of Check described by
// what; a lost conflict with a concurrent transaction (a serialization
// failure or a deadlock, told by the driver's SQLSTATE) also matches
// ErrRetry.
func dbFailure(what string, err error) error {
	var coded interface{ SQLState() string }
	if errors.As(err, &coded) {
		switch coded.SQLState() {
		case "40001", "40P01": // serialization_failure, deadlock_detected
			return fmt.Errorf("%s: %w (%w)", what, err, ErrRetry)
		}
	}
	return fmt.Errorf("%s: %w", what, err)
}

// abandon rolls tx back and returns err (joined with a rollback failure).
func abandon(tx *sql.Tx, err error) error {
	if rerr := tx.Rollback(); rerr != nil && !errors.Is(rerr, sql.ErrTxDone) {
		return errors.Join(err, fmt.Errorf("fencing: roll back: %w", rerr))
	}
	return err
}
