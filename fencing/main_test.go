package fencing_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"
	"github.com/zlink-systems/authority/internal/testkit/pgtest"
	"go.uber.org/goleak"
)

// server is the PostgreSQL every test of the package shares (one database,
// a table of its own per test); nil when skipping (skipReason).
var (
	server     *pgtest.Server
	skipReason string
	dsn        string
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	var err error
	server, skipReason, err = pgtest.StartMain()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if server != nil {
		if dsn, err = server.CreateDatabase(context.Background(), "fencing"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			_ = server.Stop()
			return 1
		}
	}
	code := m.Run()
	if server != nil {
		if err := server.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	return code
}

// openDB returns a connection pool to the test database, closed at the end of
// the test, or skips the test when PostgreSQL is not installed (never in CI).
func openDB(tb testing.TB) *sql.DB {
	tb.Helper()
	if server == nil {
		tb.Skip(skipReason)
	}
	db, err := sql.Open("pgx", dsn)
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = db.Close() })
	return db
}

var tableSeq atomic.Int64

// tableFor returns a table name no other test uses.
func tableFor(tb testing.TB, what string) string {
	name := strings.Map(func(r rune) rune {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			return r
		}
		return '_'
	}, strings.ToLower(tb.Name()))
	if len(name) > 30 {
		name = name[:30]
	}
	return fmt.Sprintf("%s_%s_%d", what, name, tableSeq.Add(1))
}
