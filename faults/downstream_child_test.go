package faults_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/fencing"
)

// The downstream writer runs in a child process (childProc): an owner that
// holds objects in the store and writes each one's row in PostgreSQL in a
// loop, through the fencing guard or without it, never looking at its
// lease (a process frozen past its lease does not know).

// envDownstreamWriter names the environment variable that makes the test
// binary run a downstream writer instead of its tests.
const envDownstreamWriter = "FAULTS_DOWNSTREAM_WRITER"

// downstreamConfig is what the test tells the writer process.
type downstreamConfig struct {
	Endpoints []string      `json:"endpoints"`
	Namespace string        `json:"namespace"`
	Tag       string        `json:"tag"`
	TTL       time.Duration `json:"ttl"`
	DSN       string        `json:"dsn"`
	Objects   int           `json:"objects"`
	Guarded   bool          `json:"guarded"`
}

// downstreamLine is one line the writer process writes: its objects and
// their tokens once placed ("ready"), or one transaction it tried
// ("write"), with the wall-clock times (Unix ns, one machine) at which it
// began, passed the guard, wrote and ended (0: not reached).
type downstreamLine struct {
	Event      string   `json:"event"`
	OwnerID    string   `json:"ownerID,omitempty"`
	Generation int64    `json:"generation,omitempty"`
	Keys       []string `json:"keys,omitempty"`
	Tokens     []int64  `json:"tokens,omitempty"`

	Key     string `json:"key,omitempty"`
	Begin   int64  `json:"begin,omitempty"`
	Checked int64  `json:"checked,omitempty"`
	Updated int64  `json:"updated,omitempty"`
	End     int64  `json:"end,omitempty"`
	Result  string `json:"result,omitempty"` // committed, stale, or error: …
}

// downstreamSQL is the schema of the rows the owners write: one row per
// object (n counts its writes, in commit order: each write updates the row
// under its row lock) and a log of every committed write.
const downstreamSQL = `
CREATE TABLE IF NOT EXISTS df_data (object text PRIMARY KEY, writer text NOT NULL, token bigint NOT NULL, n bigint NOT NULL);
CREATE TABLE IF NOT EXISTS df_log (object text NOT NULL, writer text NOT NULL, token bigint NOT NULL, n bigint NOT NULL)`

// downstreamWrite is one owner's write of object key: a transaction that
// passes the guard (nil: no guard), updates the object's row and logs the
// write, pausing at random between its steps. It returns the line that
// describes it.
func downstreamWrite(ctx context.Context, db *sql.DB, guard *fencing.Guard, key, writer string, token int64, pause func()) downstreamLine {
	stamp := func() int64 { return time.Now().UnixNano() }
	l := downstreamLine{Event: "write", Key: key, Begin: stamp()}
	tx, err := db.BeginTx(ctx, nil)
	if err == nil && guard != nil {
		err = guard.Check(ctx, tx, key, fencing.Token(token))
	}
	if err == nil {
		l.Checked = stamp()
		pause()
		_, err = tx.ExecContext(ctx, `WITH u AS (UPDATE df_data SET writer = $2, token = $3, n = n + 1 WHERE object = $1 RETURNING object, writer, token, n)
			INSERT INTO df_log SELECT * FROM u`, key, writer, token)
	}
	if err == nil {
		l.Updated = stamp()
		pause()
		err = tx.Commit()
	}
	if tx != nil && err != nil {
		_ = tx.Rollback()
	}
	l.End = stamp()
	switch {
	case err == nil:
		l.Result = "committed"
	case errors.Is(err, fencing.ErrStaleToken):
		l.Result = "stale"
	default:
		l.Result = "error: " + err.Error()
	}
	return l
}

// runDownstreamWriterIfRequested runs the writer and exits when the process
// was started as one; otherwise it returns at once.
func runDownstreamWriterIfRequested() {
	runChildIfRequested(envDownstreamWriter, "downstream writer", runDownstreamWriter)
}

// runDownstreamWriter acquires a lease, places its objects, creates their
// database rows, reports them, then writes each one in a loop of its own
// until it is ended.
func runDownstreamWriter(cfg downstreamConfig) error {
	ownerID := "downstream-a-" + cfg.Tag
	st, lease, err := childOwner(cfg.Endpoints, cfg.Namespace, ownerID, conformance.NodeA, cfg.TTL)
	if err != nil {
		return err
	}
	db, err := sql.Open("pgx", cfg.DSN)
	if err != nil {
		return err
	}
	db.SetMaxOpenConns(cfg.Objects + 1)
	var guard *fencing.Guard
	if cfg.Guarded {
		if guard, err = fencing.NewGuard(fencing.PostgreSQL, ""); err != nil {
			return err
		}
	}
	tgt := conformance.Target(conformance.NodeA, conformance.NodeLifecycle, lease.Token())
	ready := downstreamLine{Event: "ready", OwnerID: ownerID, Generation: lease.Token().LeaseGeneration}
	for i := range cfg.Objects {
		id := fmt.Sprintf("df-%s-%d", cfg.Tag, i)
		row, err := placeActive(st, tgt, id)
		if err != nil {
			return err
		}
		key, _ := authority.EncodeKey(authority.ObjectUserSpot, id)
		if _, err := db.Exec(`INSERT INTO df_data VALUES ($1, 'none', 0, 0)`, string(key)); err != nil {
			return err
		}
		ready.Keys, ready.Tokens = append(ready.Keys, string(key)), append(ready.Tokens, row.OwnershipToken)
	}
	var mu sync.Mutex
	out := json.NewEncoder(os.Stdout)
	report := func(l downstreamLine) { mu.Lock(); _ = out.Encode(l); mu.Unlock() }
	report(ready)
	for i, key := range ready.Keys {
		go func() {
			for {
				ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
				report(downstreamWrite(ctx, db, guard, key, "A", ready.Tokens[i], randomPause))
				cancel()
				randomPause()
			}
		}()
	}
	select {}
}

// randomPause sleeps 0–15 ms, so that a freeze finds the writes at every
// step of their transactions.
func randomPause() { time.Sleep(time.Duration(rand.IntN(15_000)) * time.Microsecond) }
