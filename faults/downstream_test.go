package faults_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/fencing"
	"github.com/zlink-systems/authority/internal/testkit/etcdcluster"
	"github.com/zlink-systems/authority/internal/testkit/pgtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
)

const (
	// downstreamTTL is the writer's owner lease TTL.
	downstreamTTL = 2 * time.Second
	// downstreamIdleTx is the PostgreSQL idle_in_transaction_session_timeout
	// of the owners' sessions, shorter than the lease (README: "Fencing your
	// own database"): a frozen owner's open transaction is ended by the
	// server instead of holding the object's rows for the new owner to
	// wait on.
	downstreamIdleTx = "1000"
	// downstreamWakeWrites is how many transactions each object's writer
	// must begin after it is woken.
	downstreamWakeWrites = 2
)

// downstreamEnv is the cluster, the store and the database of the
// downstream fencing tests.
type downstreamEnv struct {
	c   *etcdcluster.Cluster
	st  *etcdstore.Store
	ns  string
	dsn string
	db  *sql.DB
}

// TestDownstreamFencing: owner A, a child process, holds objects and
// writes each one's PostgreSQL row through the fencing guard with its
// ownership token. A is frozen with SIGSTOP for longer than its lease TTL —
// at a random moment, so the freeze finds its transactions before they
// begin, inside them and after their write — and once etcd expired the
// lease, B takes the objects over by the store's protocol (a new lease
// generation rebinds the rows, or RemoveAllByOwner and a fresh reservation
// by another owner) and writes each row through the guard with its new
// token. Then A is continued and keeps writing as if nothing happened. No
// write of A commits after B's: its in-flight transactions are ended or
// refused and all its later ones are refused (ErrStaleToken).
func TestDownstreamFencing(t *testing.T) {
	e := newDownstreamEnv(t)
	rounds, objects := 4, 25
	if soak() {
		rounds = 12
	}
	var sum downstreamTally
	// rounds more, up to exerciseBound times as many, while no write of
	// the woken owner was refused yet (a loaded machine can wake it late)
	r := 0
	for ; r < rounds || (sum.refused == 0 && r < exerciseBound*rounds); r++ {
		sum.add(e.round(t, fmt.Sprintf("g%d", r), objects, true, []string{"rebind", "remove"}[r%2]))
	}
	t.Logf("downstream-fencing: rounds=%d (planned %d) trials=%d stale-writes-applied=%d new-owner-writes=%d refused=%d "+
		"(frozen before-begin=%d in-transaction=%d after-write=%d; in-flight-ended=%d)",
		r, rounds, sum.trials, sum.stale, sum.newOwner, sum.refused, sum.phases["before-begin"], sum.phases["in-transaction"],
		sum.phases["after-write"], sum.inFlightEnded)
	if sum.stale != 0 {
		t.Errorf("%d writes of the replaced owner committed after the new owner's", sum.stale)
	}
	if sum.trials < 100 || sum.newOwner != sum.trials || sum.refused == 0 {
		t.Errorf("the run did not exercise the takeover (trials=%d new-owner-writes=%d refused=%d)", sum.trials, sum.newOwner, sum.refused)
	}
}

// TestDownstreamFencingUnguarded is the same scenario without the guard:
// the woken owner's writes land after the new owner's, which is what the
// guard prevents (so TestDownstreamFencing can fail).
func TestDownstreamFencingUnguarded(t *testing.T) {
	e := newDownstreamEnv(t)
	sum := e.round(t, "u0", 10, false, "rebind")
	t.Logf("downstream-fencing (no guard): trials=%d stale-writes-applied=%d new-owner-writes=%d", sum.trials, sum.stale, sum.newOwner)
	if sum.stale == 0 {
		t.Errorf("without the guard no write of the replaced owner committed after the new owner's: the scenario cannot tell")
	}
}

// newDownstreamEnv starts a PostgreSQL server (skipping when it is not
// installed and not required) and a one-member etcd cluster.
func newDownstreamEnv(t *testing.T) *downstreamEnv {
	t.Helper()
	srv, err := pgtest.Start(context.Background())
	if errors.Is(err, pgtest.ErrNotInstalled) && !pgtest.Required() {
		t.Skipf("%v (CI=true or %s=1 make this a failure)", err, pgtest.EnvRequire)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	e := &downstreamEnv{ns: "/faults/downstream/", dsn: srv.DSN("postgres")}
	if e.db, err = sql.Open("pgx", e.dsn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.db.Close() })
	guard, err := fencing.NewGuard(fencing.PostgreSQL, "")
	if err != nil {
		t.Fatal(err)
	}
	ctx := settle(t)
	if err := guard.Init(ctx, e.db); err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.ExecContext(ctx, downstreamSQL); err != nil {
		t.Fatal(err)
	}
	c, client := startCluster(t, etcdcluster.Options{Members: 1})
	e.c, e.st = c, newStore(t, client, e.ns)
	return e
}

// downstreamTally counts one or more rounds.
type downstreamTally struct {
	trials, stale, newOwner, refused, inFlightEnded int
	phases                                          map[string]int
}

func (s *downstreamTally) add(o downstreamTally) {
	s.trials, s.stale, s.newOwner = s.trials+o.trials, s.stale+o.stale, s.newOwner+o.newOwner
	s.refused, s.inFlightEnded = s.refused+o.refused, s.inFlightEnded+o.inFlightEnded
	if s.phases == nil {
		s.phases = map[string]int{}
	}
	for k, v := range o.phases {
		s.phases[k] += v
	}
}

// round runs one writer process with objects objects through a freeze, a
// takeover (mode) and a wake, and counts what landed.
func (e *downstreamEnv) round(t *testing.T, tag string, objects int, guarded bool, mode string) downstreamTally {
	t.Helper()
	w := startDownstreamWriter(t, downstreamConfig{Endpoints: e.c.Endpoints(), Namespace: e.ns, Tag: tag, TTL: downstreamTTL,
		DSN: e.dsn + " idle_in_transaction_session_timeout=" + downstreamIdleTx, Objects: objects, Guarded: guarded})
	old := authority.OwnerToken{OwnerID: w.ready.OwnerID, LeaseGeneration: w.ready.Generation}
	w.waitCommitted(t, w.ready.Keys)
	time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond)
	frozen := time.Now()
	w.signal(t, syscall.SIGSTOP)
	waitExpired(t, e.st, conformance.Target(conformance.NodeA, conformance.NodeLifecycle, old))

	tokens := e.takeOver(t, tag, mode, old, w.ready.Keys)
	var guard *fencing.Guard
	if guarded {
		guard, _ = fencing.NewGuard(fencing.PostgreSQL, "")
	}
	out := downstreamTally{trials: objects, phases: map[string]int{}}
	for _, key := range w.ready.Keys {
		if e.writeAsNewOwner(t, guard, key, tokens[key]) {
			out.newOwner++
		}
	}
	woke := time.Now()
	w.signal(t, syscall.SIGCONT)
	w.waitBegunAfter(t, woke, w.ready.Keys)
	w.stop(t)
	out.stale = e.staleWrites(t, w.ready.Keys)
	w.classify(frozen, woke, &out)
	return out
}

// takeOver moves the writer's objects off its expired lease by the store's
// protocol and returns each object's new ownership token.
func (e *downstreamEnv) takeOver(t *testing.T, tag, mode string, old authority.OwnerToken, keys []string) map[string]int64 {
	t.Helper()
	tokens := map[string]int64{}
	switch mode {
	case "rebind": // a new lease generation of the same owner takes the rows
		next := e.acquire(t, conformance.NodeA, old.OwnerID)
		for _, key := range keys {
			tokens[key] = rebind(t, e.st, authority.Key(key), old, next.Token()).OwnershipToken
		}
	case "remove": // the rows go; another owner on another node creates them afresh
		eventually(t, "remove the frozen owner's rows", func(ctx context.Context) error {
			_, err := e.st.RemoveAllByOwner(ctx, old)
			return err
		})
		b := e.acquire(t, conformance.NodeB, "downstream-b-"+tag)
		tgt := conformance.Target(conformance.NodeB, conformance.NodeLifecycle, b.Token())
		for _, key := range keys {
			_, id, _ := strings.Cut(key, "/")
			r := mustReserve(t, e.st, reserveRequest(authority.ObjectUserSpot, id, tgt, id+"-b"))
			tokens[key] = mustCommit(t, e.st, r, id+"-b-ready").OwnershipToken
		}
	}
	return tokens
}

// acquire takes an owner lease of ownerID on node for the rest of the test.
func (e *downstreamEnv) acquire(t *testing.T, node authority.NodeDescriptor, ownerID string) *etcdstore.OwnerLease {
	t.Helper()
	var l *etcdstore.OwnerLease
	eventually(t, "acquire the new owner's lease", func(ctx context.Context) error {
		var err error
		l, err = e.st.Registry().Acquire(ctx, node, conformance.NodeLifecycle, ownerID, time.Minute)
		return err
	})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		_ = l.Close(ctx)
	})
	return l
}

// writeAsNewOwner writes key's row as B with token, retrying what is not a
// refusal, and reports whether it committed.
func (e *downstreamEnv) writeAsNewOwner(t *testing.T, guard *fencing.Guard, key string, token int64) bool {
	t.Helper()
	for range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
		l := downstreamWrite(ctx, e.db, guard, key, "B", token, func() {})
		cancel()
		switch {
		case l.Result == "committed":
			return true
		case l.Result == "stale":
			t.Errorf("the new owner's write of %s with token %d was refused", key, token)
			return false
		}
		time.Sleep(retryPause)
	}
	t.Errorf("the new owner could not write %s", key)
	return false
}

// staleWrites counts the writes of A that committed after B's first write
// of the same object: the order of commits is the row's write count n.
func (e *downstreamEnv) staleWrites(t *testing.T, keys []string) int {
	t.Helper()
	var n int
	err := e.db.QueryRowContext(settle(t), `SELECT count(*) FROM df_log a
		WHERE a.writer = 'A' AND a.object = ANY($1)
		AND a.n > (SELECT min(b.n) FROM df_log b WHERE b.object = a.object AND b.writer = 'B')`, keys).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// downstreamProc is the test's handle on a writer process: its lines are
// its transactions.
type downstreamProc struct {
	*lineChild[downstreamLine]
}

// startDownstreamWriter starts a writer process and waits until its objects
// are placed.
func startDownstreamWriter(t *testing.T, cfg downstreamConfig) *downstreamProc {
	t.Helper()
	return &downstreamProc{startLineChild(t, envDownstreamWriter, cfg, func(l downstreamLine) bool { return l.Event == "ready" })}
}

// waitCommitted waits until every key has a committed write.
func (p *downstreamProc) waitCommitted(t *testing.T, keys []string) {
	p.waitFor(t, "a committed write of every object", func(ws []downstreamLine) bool {
		seen := map[string]bool{}
		for _, w := range ws {
			seen[w.Key] = seen[w.Key] || w.Result == "committed"
		}
		for _, k := range keys {
			if !seen[k] {
				return false
			}
		}
		return true
	})
}

// waitBegunAfter waits until every key has downstreamWakeWrites
// transactions that began after from and ended.
func (p *downstreamProc) waitBegunAfter(t *testing.T, from time.Time, keys []string) {
	p.waitFor(t, "writes after the wake", func(ws []downstreamLine) bool {
		n := map[string]int{}
		for _, w := range ws {
			if w.Begin > from.UnixNano() {
				n[w.Key]++
			}
		}
		for _, k := range keys {
			if n[k] < downstreamWakeWrites {
				return false
			}
		}
		return true
	})
}

// classify counts, per object, where the freeze found its writer (before a
// transaction began, inside one before its write, or after its write), the
// writes refused after the wake, and the in-flight ones that did not commit.
func (p *downstreamProc) classify(frozen, woke time.Time, out *downstreamTally) {
	phase := map[string]string{}
	for _, w := range p.collected() {
		switch {
		case w.Begin < frozen.UnixNano() && w.End > woke.UnixNano(): // in flight across the freeze
			phase[w.Key] = "in-transaction"
			if w.Updated != 0 && w.Updated < frozen.UnixNano() {
				phase[w.Key] = "after-write"
			}
			if w.Result != "committed" {
				out.inFlightEnded++
			}
		case w.Begin > woke.UnixNano() && w.Result != "committed":
			out.refused++
		}
	}
	for _, k := range p.ready.Keys {
		if phase[k] == "" {
			phase[k] = "before-begin"
		}
		out.phases[phase[k]]++
	}
}
