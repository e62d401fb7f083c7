package fencing_test

import (
	"context"
	"database/sql"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
	"github.com/zlink-systems/authority/fencing"
)

// TestConcurrentTokensCommitInTokenOrder: workers write one object at once,
// each transaction with a random token (ties included). Each committed
// transaction also logs its token in a separate table; the database's own
// commit timestamps (track_commit_timestamp) order the log. The guard must
// make the committed tokens non-decreasing in commit order, record the
// maximum, and leave the caller's last-writer-wins row at the maximum — in
// every isolation level (REPEATABLE READ and SERIALIZABLE retry on
// serialization failures, as Check documents).
func TestConcurrentTokensCommitInTokenOrder(t *testing.T) {
	for _, iso := range []sql.IsolationLevel{sql.LevelReadCommitted, sql.LevelRepeatableRead, sql.LevelSerializable} {
		t.Run(iso.String(), func(t *testing.T) { concurrentWriters(t, iso) })
	}
}

type tally struct {
	mu                          sync.Mutex
	committed, refused, retries int
	maxToken                    fencing.Token
	errs                        []error
}

func concurrentWriters(t *testing.T, iso sql.IsolationLevel) {
	const workers, rounds = 8, 25
	db := openDB(t)
	db.SetMaxOpenConns(workers + 1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	g, err := fencing.NewGuard(fencing.PostgreSQL, tableFor(t, "fence"))
	require.NoError(t, err)
	require.NoError(t, g.Init(ctx, db))
	logTable, rowTable := tableFor(t, "log"), tableFor(t, "row")
	_, err = db.ExecContext(ctx, `CREATE TABLE `+logTable+` (token bigint NOT NULL, worker int NOT NULL)`)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, `CREATE TABLE `+rowTable+` (object text PRIMARY KEY, token bigint NOT NULL)`)
	require.NoError(t, err)

	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	var tl tally
	rngs := make([]*rand.Rand, workers)
	for w := range rngs {
		rngs[w] = rand.New(rand.NewPCG(seed, uint64(w)))
	}
	// Rounds: in round i every worker starts a transaction at once, with a
	// token rising with i and overlapping jitter (ties included), so owners
	// replace one another while older ones are still writing.
	for i := 0; i < rounds && ctx.Err() == nil; i++ {
		var wg sync.WaitGroup
		for w := 0; w < workers; w++ {
			token := fencing.Token(1 + 3*i + rngs[w].IntN(10))
			wg.Add(1)
			go func() {
				defer wg.Done()
				guardedWrite(ctx, db, g, iso, logTable, rowTable, w, token, &tl)
			}()
		}
		wg.Wait()
	}
	require.NoError(t, errors.Join(tl.errs...))
	t.Logf("%v: committed=%d refused=%d serialization-retries=%d", iso, tl.committed, tl.refused, tl.retries)
	require.Equal(t, workers*rounds, tl.committed+tl.refused)
	require.Positive(t, tl.refused, "random tokens from concurrent owners: some must be stale")

	// Commit order, from the database's own commit timestamps.
	r, err := db.QueryContext(ctx, `SELECT token, pg_xact_commit_timestamp(xmin) AS at FROM `+logTable+` ORDER BY at, token`)
	require.NoError(t, err)
	defer r.Close()
	var logged []int64
	var prevAt time.Time
	for r.Next() {
		var tok int64
		var at time.Time
		require.NoError(t, r.Scan(&tok, &at))
		require.False(t, at.Before(prevAt))
		if n := len(logged); n > 0 {
			require.GreaterOrEqual(t, tok, logged[n-1], "token %d committed at %v after token %d: a stale write landed", tok, at, logged[n-1])
		}
		logged, prevAt = append(logged, tok), at
	}
	require.NoError(t, r.Err())
	require.Len(t, logged, tl.committed, "every committed transaction logged once, no refused one")
	require.Equal(t, int64(tl.maxToken), logged[len(logged)-1], "the highest token attempted committed last")

	highest, err := g.Highest(ctx, db, "actor/contended")
	require.NoError(t, err)
	require.Equal(t, tl.maxToken, highest)
	var rowToken int64
	require.NoError(t, db.QueryRowContext(ctx, `SELECT token FROM `+rowTable+` WHERE object = 'actor/contended'`).Scan(&rowToken))
	require.Equal(t, int64(tl.maxToken), rowToken, "the caller's row holds the newest owner's write")
}

// guardedWrite runs one owner's transaction: Check, then the owner's own
// writes (a log row and its last-writer-wins row), retrying serialization
// failures.
func guardedWrite(ctx context.Context, db *sql.DB, g *fencing.Guard, iso sql.IsolationLevel,
	logTable, rowTable string, worker int, token fencing.Token, tl *tally) {
	for attempt := 0; ; attempt++ {
		err := func() error {
			tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: iso})
			if err != nil {
				return err
			}
			defer tx.Rollback()
			if err := g.Check(ctx, tx, "actor/contended", token); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO `+logTable+` (token, worker) VALUES ($1, $2)`, int64(token), worker); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO `+rowTable+` (object, token) VALUES ('actor/contended', $1) `+
				`ON CONFLICT (object) DO UPDATE SET token = EXCLUDED.token`, int64(token)); err != nil {
				return err
			}
			return tx.Commit()
		}()
		tl.mu.Lock()
		tl.maxToken = max(tl.maxToken, token)
		switch {
		case err == nil:
			tl.committed++
		case errors.Is(err, fencing.ErrStaleToken):
			tl.refused++
		case serializationFailure(err) && attempt < 1000:
			tl.retries++
			tl.mu.Unlock()
			continue
		default:
			tl.errs = append(tl.errs, err)
		}
		tl.mu.Unlock()
		return
	}
}

func serializationFailure(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}
