package fencing_test

import (
	"context"
	"database/sql"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/zlink-systems/authority/fencing"
)

// BenchmarkCheck measures one guarded transaction (Check, then an INSERT,
// commit) against the same transaction without the guard, in the same run on
// the same server: the difference is the guard's cost.
//
//	baseline:    BEGIN; INSERT; COMMIT
//	same-object: BEGIN; Check (one object, the owner's token each time); INSERT; COMMIT
//	new-object:  BEGIN; Check (a new object each time: an insert into the fence); INSERT; COMMIT
//	bound-same-object: same-object with a guard bound to a cluster (ForCluster)
//	parallel-objects: new-object from 8 sessions at once; every Check locks the
//	                  table's cluster row shared (a multixact of the holders)
func BenchmarkCheck(b *testing.B) {
	db := openDB(b)
	ctx := context.Background()
	g, err := fencing.NewGuard(fencing.PostgreSQL, tableFor(b, "fence"))
	require.NoError(b, err)
	require.NoError(b, g.Init(ctx, db))
	data := tableFor(b, "data")
	_, err = db.ExecContext(ctx, `CREATE TABLE `+data+` (id bigserial PRIMARY KEY, object text NOT NULL, token bigint NOT NULL)`)
	require.NoError(b, err)
	insert := `INSERT INTO ` + data + ` (object, token) VALUES ($1, $2)`

	run := func(b *testing.B, check func(tx *sql.Tx, i int) error) {
		for i := 0; b.Loop(); i++ {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				b.Fatal(err)
			}
			if check != nil {
				if err := check(tx, i); err != nil {
					b.Fatal(err)
				}
			}
			if _, err := tx.ExecContext(ctx, insert, "actor/bench", int64(i+1)); err != nil {
				b.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("baseline", func(b *testing.B) { run(b, nil) })
	b.Run("same-object", func(b *testing.B) {
		run(b, func(tx *sql.Tx, i int) error { return g.Check(ctx, tx, "actor/bench", 7) })
	})
	b.Run("new-object", func(b *testing.B) {
		run(b, func(tx *sql.Tx, i int) error { return g.Check(ctx, tx, fmt.Sprintf("actor/%s/%d", b.Name(), i), 1) })
	})
	b.Run("parallel-objects", func(b *testing.B) {
		db.SetMaxOpenConns(9)
		b.SetParallelism(8 / max(1, runtime.GOMAXPROCS(0)))
		var seq atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				i := seq.Add(1)
				tx, err := db.BeginTx(ctx, nil)
				if err == nil {
					if err = g.Check(ctx, tx, fmt.Sprintf("actor/parallel/%d", i), 1); err == nil {
						if _, err = tx.ExecContext(ctx, insert, "actor/parallel", i); err == nil {
							err = tx.Commit()
						}
					}
				}
				if err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	// a table of its own: a bound guard makes its table follow its cluster
	other, err := fencing.NewGuard(fencing.PostgreSQL, tableFor(b, "fence_bound"))
	require.NoError(b, err)
	require.NoError(b, other.Init(ctx, db))
	bound, err := other.ForCluster("cdf818194e3a8c32")
	require.NoError(b, err)
	b.Run("bound-same-object", func(b *testing.B) {
		run(b, func(tx *sql.Tx, i int) error { return bound.Check(ctx, tx, "actor/bench", 7) })
	})
}
