package fencing_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zlink-systems/authority/fencing"
)

// TestCheckWaitsForTheObjectsHolder: after Check, the object's fence row
// stays locked until the transaction ends. A second owner's Check waits for
// it, then judges its token against what the first committed: a lower one is
// refused even though it was not stale when it started waiting. A Check
// whose context ends while waiting fails and rolls its transaction back.
func TestCheckWaitsForTheObjectsHolder(t *testing.T) {
	db := openDB(t)
	ctx := context.Background()
	g, data := newGuard(t, db)
	require.NoError(t, write(ctx, db, g, data, "actor/a", 3))

	holder, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer holder.Rollback()
	require.NoError(t, g.Check(ctx, holder, "actor/a", 9))

	// A waiter whose context ends while the holder is open.
	impatient, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	shortCtx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	err = g.Check(shortCtx, impatient, "actor/a", 10)
	cancel()
	require.Error(t, err)
	require.NotErrorIs(t, err, fencing.ErrStaleToken)
	require.ErrorIs(t, impatient.Commit(), sql.ErrTxDone)

	// A waiter with token 7 (above the committed 3, below the holder's 9).
	done := make(chan error, 1)
	go func() { done <- write(ctx, db, g, data, "actor/a", 7) }()
	waitForLockWaiter(t, db)
	select {
	case err := <-done:
		t.Fatalf("Check returned while the holder was open: %v", err)
	default:
	}
	_, err = holder.ExecContext(ctx, `INSERT INTO `+data+` (object, token) VALUES ('actor/a', 9)`)
	require.NoError(t, err)
	require.NoError(t, holder.Commit())
	err = <-done
	require.ErrorIs(t, err, fencing.ErrStaleToken)
	var stale *fencing.StaleTokenError
	require.ErrorAs(t, err, &stale)
	require.Equal(t, fencing.Token(9), stale.Highest)
	require.Equal(t, []int64{3, 9}, rows(t, db, data, "actor/a"))
}

// waitForLockWaiter waits until some backend of the test database waits on
// a lock (pg_stat_activity).
func waitForLockWaiter(t *testing.T, db *sql.DB) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		require.NoError(t, db.QueryRow(`SELECT count(*) FROM pg_stat_activity `+
			`WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n))
		if n > 0 {
			return
		}
		require.True(t, time.Now().Before(deadline), "no backend waits on the fence row lock")
		time.Sleep(10 * time.Millisecond)
	}
}
