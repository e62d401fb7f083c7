package faults_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdcluster"
	lin "github.com/zlink-systems/authority/internal/testkit/linearizability"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
)

// soakEnv names the environment variable that enables the soak run and
// holds its duration (for example AUTHORITY_SOAK=5m).
const soakEnv = "AUTHORITY_SOAK"

// soakWriter keeps CAS-writing its own row through faults and counts lost
// writes: the row must always hold the last acknowledged write or one of
// the writes of unknown outcome sent since (a write held in a partitioned
// proxy may apply after a later read still showed the acknowledged one).
type soakWriter struct {
	key     authority.Key
	st      *etcdstore.Store
	acked   string
	version authority.StoreVersion
	seq     int
	writes  atomic.Int64
	lost    atomic.Int64
}

func (w *soakWriter) run(ctx context.Context, t *testing.T) {
	// the payloads of unknown outcome sent at w.version; any of them may
	// still apply until the row moves past that version
	unknown := map[string]bool{}
	resync := false
	// moved takes row as the new last known state; it reports whether the
	// row holds a write this writer made.
	moved := func(row *authority.Snapshot) bool {
		got := string(row.Payload)
		if got == w.acked {
			return true
		}
		if !unknown[got] {
			w.lost.Add(1)
			t.Errorf("soak: %s: acknowledged write %q lost: row holds %q", w.key, w.acked, got)
			return false
		}
		w.writes.Add(1)
		w.acked, w.version = got, row.StoreVersion
		clear(unknown) // they all compared an older version
		return true
	}
	for ctx.Err() == nil {
		if resync { // read until the store answers
			octx, cancel := context.WithTimeout(context.Background(), opTimeout)
			r, err := w.st.ReadAuthority(octx, w.key)
			cancel()
			if err != nil {
				sleepCtx(ctx, retryPause)
				continue
			}
			if r.Kind != authority.KindSnapshot {
				w.lost.Add(1)
				t.Errorf("soak: %s: acknowledged write %q lost: row is %s", w.key, w.acked, r.Kind)
				return
			}
			if !moved(r.Snapshot) {
				return
			}
			resync = false
		}
		w.seq++
		payload := fmt.Sprintf("%s-soak-%d", w.key, w.seq)
		octx, cancel := context.WithTimeout(context.Background(), opTimeout)
		res, err := w.st.CompareExchangeAuthority(octx, w.key, w.version, authority.Put([]byte(payload)))
		cancel()
		switch {
		case err != nil && notApplied(err):
			sleepCtx(ctx, retryPause)
		case err != nil:
			unknown[payload], resync = true, true
		case res.Kind == authority.KindStored:
			w.acked, w.version = payload, res.Snapshot.StoreVersion
			w.writes.Add(1)
			clear(unknown)
		case res.Kind == authority.KindConflict && res.Current.Snapshot != nil && unknown[string(res.Current.Snapshot.Payload)]:
			moved(res.Current.Snapshot) // an earlier write of unknown outcome applied meanwhile
		default:
			w.lost.Add(1)
			t.Errorf("soak: %s: CAS at the last known version: %s (current %+v)", w.key, res.Kind, res.Current.Snapshot)
			return
		}
	}
}

// TestSoak runs mixed traffic from many clients for $AUTHORITY_SOAK with
// periodic faults (leader kills, blackholes, lost replies, dropped
// connections) and prints one summary line. Skipped unless AUTHORITY_SOAK
// is set.
func TestSoak(t *testing.T) {
	raw := os.Getenv(soakEnv)
	if raw == "" {
		t.Skipf("set %s=<duration> (e.g. 5m) to run the soak", soakEnv)
	}
	d, err := time.ParseDuration(raw)
	if err != nil || d <= 0 {
		t.Fatalf("%s=%q: want a positive duration", soakEnv, raw)
	}
	c, cli := startCluster(t, etcdcluster.Options{})
	const ns = "/faults/soak/"
	admin := newStore(t, cli, ns)
	tgt := conformance.Target(conformance.NodeA, conformance.NodeLifecycle, authority.OwnerToken{OwnerID: "soak-owner", LeaseGeneration: 1})
	markLive(t, admin, tgt, max(ownerTTL, d+5*time.Minute))

	// the traffic's clients are closed before the end figures are taken
	var closers []func()
	newClientStore := func(members ...int) *etcdstore.Store {
		eps := make([]string, len(members))
		for i, m := range members {
			eps[i] = c.Endpoint(m)
		}
		cl, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		s, err := etcdstore.New(context.Background(), etcdstore.Config{Client: cl, Namespace: ns, RequestTimeout: requestTimeout, SkipVersionCheck: true})
		if err != nil {
			t.Fatal(err)
		}
		closers = append(closers, func() { _ = s.Close(); _ = cl.Close() })
		return s
	}
	all := []int{0, 1, 2}

	writers := make([]*soakWriter, 4)
	for i := range writers {
		id := fmt.Sprintf("soak-writer-%d", i)
		r := mustReserve(t, admin, reserveRequest(authority.ObjectUserSpot, id, tgt, id+"-creating"))
		row := mustCommit(t, admin, r, id+"-ready")
		writers[i] = &soakWriter{key: objectKey(t, authority.ObjectUserSpot, id), acked: id + "-ready", version: row.StoreVersion}
	}

	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	goroutinesBefore := runtime.NumGoroutine()

	seed := uint64(time.Now().UnixNano())
	w := newWorkload(t, func() *etcdstore.Store { return newClientStore(all...) }, tgt, 16, keyNames("soak-", 24), seed)
	for _, sw := range writers {
		sw.st = newClientStore(all...)
	}
	nem := newNemesis(c, seed)
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var wg sync.WaitGroup
	var nemErr error
	wg.Add(1 + len(writers))
	go func() {
		defer wg.Done()
		nemErr = nem.cycle(ctx, 3*time.Second,
			func(ctx context.Context) error { return nem.killLeader(ctx, time.Second) },
			func(ctx context.Context) error { return nem.partition(ctx, "blackhole", 2*time.Second) },
			func(ctx context.Context) error { return nem.partition(ctx, "hold-replies", time.Second) },
			func(ctx context.Context) error { return nem.partition(ctx, "drop", time.Second) },
		)
	}()
	for _, sw := range writers {
		go func() {
			defer wg.Done()
			sw.run(ctx, t)
		}()
	}
	w.run(ctx)
	wg.Wait()
	if nemErr != nil {
		t.Errorf("nemesis: %v", nemErr)
	}
	for _, f := range closers {
		f()
	}

	h, n := w.rec.history()
	result, path, verr := lin.Verdict(h, 10*time.Minute)
	verdict := string(result)
	switch {
	case verr != nil:
		t.Errorf("linearizability: %v", verr)
	case result == porcupine.Illegal:
		t.Errorf("linearizability: violation; visualization: %s", path)
	case result != porcupine.Ok:
		verdict += " (undecided: " + path + ")"
	}

	var lost, acked int64
	for _, sw := range writers {
		lost += sw.lost.Load()
		acked += sw.writes.Load()
	}
	// closed connections' goroutines take a moment to end
	goroutinesAfter := runtime.NumGoroutine()
	for i := 0; i < 50 && goroutinesAfter > goroutinesBefore; i++ {
		time.Sleep(100 * time.Millisecond)
		goroutinesAfter = runtime.NumGoroutine()
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	faults, kinds := nem.injected()
	t.Logf("soak: duration=%s ops=%d writer-acks=%d faults=%d (%s) linearizability=%s (returned=%d unknown=%d discarded=%d) lost-writes=%d goroutines=%d->%d (%+d) heap=%.1fMiB->%.1fMiB (%+.1fMiB, includes the recorded history)",
		d, w.stats.ops.Load(), acked, faults, kinds, verdict, n.returned, n.unknown, n.discarded, lost,
		goroutinesBefore, goroutinesAfter, goroutinesAfter-goroutinesBefore,
		mib(before.HeapAlloc), mib(after.HeapAlloc), mib(after.HeapAlloc)-mib(before.HeapAlloc))
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }
