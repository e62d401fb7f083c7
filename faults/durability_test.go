package faults_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdcluster"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
)

// chainWriter writes a chain of CAS puts on its own row and remembers the
// last acknowledged payload and the payload of a write whose outcome is
// unknown.
type chainWriter struct {
	key     authority.Key
	st      *etcdstore.Store
	acked   string
	version authority.StoreVersion
	pending string // written with an unknown outcome after acked, if any
	n       int    // acknowledged writes
	seq     int
}

// run writes until a write fails or ctx ends. It returns the number of
// acknowledged writes.
func (w *chainWriter) run(ctx context.Context, tag string) {
	for ctx.Err() == nil {
		w.seq++
		payload := fmt.Sprintf("%s-%s-%d", w.key, tag, w.seq)
		octx, cancel := context.WithTimeout(context.Background(), opTimeout)
		res, err := w.st.CompareExchangeAuthority(octx, w.key, w.version, authority.Put([]byte(payload)))
		cancel()
		if err != nil {
			if !notApplied(err) {
				w.pending = payload
			}
			return
		}
		if res.Kind != authority.KindStored {
			w.pending = "conflict:" + string(res.Kind) // the check will flag it
			return
		}
		w.acked, w.version, w.pending = payload, res.Snapshot.StoreVersion, ""
		w.n++
	}
}

// check reads the row with st and reports whether it holds the last
// acknowledged write (or the unknown one after it); it then continues the
// chain from what it read.
func (w *chainWriter) check(t *testing.T, st *etcdstore.Store) (lost bool) {
	t.Helper()
	r := mustRead(t, st, w.key)
	if r.Kind != authority.KindSnapshot {
		t.Errorf("%s: acknowledged write %q lost: row %s", w.key, w.acked, r.Kind)
		return true
	}
	got := string(r.Snapshot.Payload)
	switch {
	case got == w.acked && r.Snapshot.StoreVersion == w.version:
	case w.pending != "" && got == w.pending:
	default:
		t.Errorf("%s: acknowledged write %q (version %s) lost: row holds %q (version %s), unknown write %q",
			w.key, w.acked, w.version, got, r.Snapshot.StoreVersion, w.pending)
		return true
	}
	w.st, w.acked, w.version, w.pending = st, got, r.Snapshot.StoreVersion, ""
	return false
}

// TestAcknowledgedWritesSurviveFullCrash writes through the provider while
// every member of a cluster with fsync on is killed at once, restarts the
// cluster, and requires every acknowledged write (and every committed
// creation) to be there. It runs two rounds.
func TestAcknowledgedWritesSurviveFullCrash(t *testing.T) {
	c, cli := startCluster(t, etcdcluster.Options{Fsync: true})
	const ns = "/faults/durability/"
	st := newStore(t, cli, ns)
	tgt := conformance.Target(conformance.NodeA, conformance.NodeLifecycle, authority.OwnerToken{OwnerID: "durable-owner", LeaseGeneration: 1})
	markLive(t, st, tgt, ownerTTL)

	const writers = 6
	ws := make([]*chainWriter, writers)
	created := 0
	for i := range ws {
		id := fmt.Sprintf("durable-%d", i)
		r := mustReserve(t, st, reserveRequest(authority.ObjectUserSpot, id, tgt, id+"-creating"))
		row := mustCommit(t, st, r, id+"-ready")
		created++
		ws[i] = &chainWriter{key: objectKey(t, authority.ObjectUserSpot, id), st: newStore(t, c.Client(t), ns), acked: id + "-ready", version: row.StoreVersion}
	}

	const rounds = 2
	acked, lost := 0, 0
	for round := range rounds {
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for _, w := range ws {
			wg.Add(1)
			go func() {
				defer wg.Done()
				w.run(ctx, fmt.Sprintf("r%d", round))
			}()
		}
		// let the writers get going, then crash every member at once
		time.Sleep(500 * time.Millisecond)
		var kill sync.WaitGroup
		for i := range c.Size() {
			kill.Add(1)
			go func() {
				defer kill.Done()
				if err := c.Kill(i); err != nil {
					t.Errorf("kill %d: %v", i, err)
				}
			}()
		}
		kill.Wait()
		wg.Wait() // every writer stops at its first failed write
		cancel()
		for _, w := range ws {
			acked += w.n
			w.n = 0
		}
		for i := range c.Size() {
			if err := c.Restart(i); err != nil {
				t.Fatal(err)
			}
		}
		waitHealthy(t, c)

		// a fresh store: nothing comes from a cache
		fresh := newStore(t, c.Client(t), ns)
		for _, w := range ws {
			if w.check(t, fresh) {
				lost++
			}
		}
		u := conformance.Capacity(authority.ObjectUserSpot, conformance.DefaultStableType)
		var usage authority.CapacityUsage
		eventually(t, "capacity usage", func(ctx context.Context) error {
			var err error
			usage, err = fresh.CapacityUsage(ctx, tgt.Descriptor(), tgt.NodeLifecycleGeneration, authority.ObjectUserSpot, u.SpotType.StableType)
			return err
		})
		if usage.Active != int64(created) || usage.Reserved != 0 {
			t.Errorf("round %d: capacity after the crash: active=%d reserved=%d, want %d and 0", round, usage.Active, usage.Reserved, created)
		}
	}
	t.Logf("durability: rounds=%d members-killed=%d acknowledged=%d created=%d lost=%d", rounds, rounds*c.Size(), acked, created, lost)
	if acked == 0 {
		t.Error("no write was acknowledged before the crash: the test tests nothing")
	}
}
