package faults_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdcluster"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/sharded"
	"github.com/zlink-systems/authority/provider/sharded/reshard"
)

// TestReshardScale measures a resharding from one cluster to two (real
// etcd processes, fsync on) of AUTHORITY_RESHARD_SCALE_ROWS rows (skipped
// when unset), mean payload 1 KiB, while 8 writers rewrite random rows
// throughout. It prints
//
//	reshard-scale: rows=… moved=… total-s=… copy-s=… copy-rows/s=… raised=… raise-s=… catch-up-s=… switch-ms=… cleanup-s=… writes=… write-p99-ms-before=… write-p99-ms-during=… refused=… max-refused-ms=…
//
// switch-ms is the time from the first freeze to the next map in force
// everywhere: the longest a row that moves is refused.
func TestReshardScale(t *testing.T) {
	v := os.Getenv("AUTHORITY_RESHARD_SCALE_ROWS")
	if v == "" {
		t.Skip("set AUTHORITY_RESHARD_SCALE_ROWS (e.g. 10000) to measure a resharding")
	}
	rows, err := strconv.Atoi(v)
	if err != nil || rows < 1 {
		t.Fatalf("AUTHORITY_RESHARD_SCALE_ROWS=%q", v)
	}
	var cfgs []etcdstore.Config
	for range 2 {
		c, _ := startCluster(t, etcdcluster.Options{Members: 1, Fsync: true, MaxTxnOps: 1024})
		cfgs = append(cfgs, etcdstore.Config{Endpoints: c.Endpoints(), Namespace: "/faults/reshard-scale/", MaxTxnOps: 1024,
			RequestTimeout: 10 * time.Second})
	}
	ctx := context.Background()
	s, err := sharded.New(ctx, sharded.Config{Shards: cfgs[:1], Spares: cfgs[1:]})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	node := authority.NodeDescriptor{MeshName: "mesh", RID: "scale"}
	lease, err := s.Registry().Acquire(ctx, node, 1, "scale", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lease.Close(context.Background()) })
	target := conformance.Target(node, 1, lease.Token())
	keys := fillScale(t, s, target, rows)

	w := &scaleWriters{s: s, keys: keys}
	w.start(8)
	time.Sleep(3 * time.Second) // the writes' latency before
	w.mark()
	steps := map[string]time.Time{}
	var mu sync.Mutex
	start := time.Now()
	p, err := reshard.Run(ctx, reshard.Config{Shards: cfgs[:1], Add: cfgs[1], Batch: 256, Step: func(step string) {
		mu.Lock()
		defer mu.Unlock()
		if _, ok := steps[step]; !ok {
			steps[step] = time.Now()
		}
	}})
	total := time.Since(start)
	w.stop()
	if err != nil || p.Phase != "done" {
		t.Fatalf("resharding: %v (%v)", err, p)
	}
	var raiseStart time.Time
	for step, at := range steps {
		if strings.HasPrefix(step, "raising") && (raiseStart.IsZero() || at.Before(raiseStart)) {
			raiseStart = at
		}
	}
	raiseS := 0.0
	if !raiseStart.IsZero() {
		raiseS = steps[`copying shard 0 after ""`].Sub(raiseStart).Seconds()
	}
	copyS := steps["catching up"].Sub(start).Seconds()
	catchUp := steps["freezing shard 0"].Sub(steps["catching up"]).Seconds()
	switchMs := steps["deleting the moved keys from shard 0"].Sub(steps["freezing shard 0"]).Milliseconds()
	moved := int64(0)
	for _, k := range keys {
		if sharded.Place(k, 2) == 1 {
			moved++
		}
	}
	before, during := w.p99()
	t.Logf("reshard-scale: rows=%d moved=%d total-s=%.1f copy-s=%.1f copy-rows/s=%.0f raised=%d raise-s=%.1f catch-up-s=%.1f switch-ms=%d cleanup-s=%.1f writes=%d write-p99-ms-before=%.1f write-p99-ms-during=%.1f refused=%d max-refused-ms=%d",
		rows, moved, total.Seconds(), copyS, float64(moved)/copyS, p.Raised, raiseS, catchUp, switchMs,
		total.Seconds()-steps["deleting the moved keys from shard 0"].Sub(start).Seconds(), w.writes.Load(), before, during,
		w.refused.Load(), time.Duration(w.maxRefused.Load()).Milliseconds())
	if f := w.failed.Load(); f != nil {
		t.Errorf("a writer failed: %v", *f)
	}
}

// fillScale creates rows rows through s, 32 at a time.
func fillScale(t *testing.T, s *sharded.Store, target authority.CreationTarget, rows int) []authority.Key {
	t.Helper()
	keys := make([]authority.Key, rows)
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	start := time.Now()
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < rows && failed.Load() == nil; i = int(next.Add(1) - 1) {
				id := fmt.Sprintf("scale-%07d", i)
				req := authority.ReserveRequest{Key: authority.ObjectKey{Kind: authority.ObjectUserSpot, GlobalID: id},
					Intent: authority.CreationIntent{StableType: conformance.DefaultStableType, RequestContentReference: "r",
						RequestSHA256: make([]byte, 32), RequestEncodedSize: 1},
					Target: target, CreatingPayload: []byte("c"), Capacity: conformance.Capacity(authority.ObjectUserSpot, conformance.DefaultStableType)}
				res, err := s.Reserve(context.Background(), req)
				if err == nil && res.Kind == authority.KindReserved {
					_, err = s.Commit(context.Background(), authority.CommitRequest{Key: req.Key, ReservationID: res.ReservationID,
						ExpectedStoreVersion: res.Creating.StoreVersion, Target: target, ReadyPayload: failoverPayload(i)})
				}
				if err != nil {
					failed.Store(&err)
					return
				}
				keys[i], _ = req.Key.Encode()
			}
		}()
	}
	wg.Wait()
	if err := failed.Load(); err != nil {
		t.Fatalf("filling: %v", *err)
	}
	t.Logf("filled %d rows in %s", rows, time.Since(start).Round(time.Millisecond))
	return keys
}

// scaleWriters rewrite random rows and time each write.
type scaleWriters struct {
	s               *sharded.Store
	keys            []authority.Key
	writes, refused atomic.Int64
	maxRefused      atomic.Int64
	failed          atomic.Pointer[error]
	mu              sync.Mutex
	before, during  []time.Duration
	marked          atomic.Bool
	quit            chan struct{}
	wg              sync.WaitGroup
}

func (w *scaleWriters) start(n int) {
	w.quit = make(chan struct{})
	for range n {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			for {
				select {
				case <-w.quit:
					return
				default:
				}
				if err := w.one(w.keys[rand.IntN(len(w.keys))]); err != nil {
					w.failed.Store(&err)
					return
				}
			}
		}()
	}
}

// one rewrites key once, retrying while it is refused for the move.
func (w *scaleWriters) one(key authority.Key) error {
	start := time.Now()
	var first time.Time
	for {
		read, err := w.s.ReadAuthority(context.Background(), key)
		var res authority.CompareExchangeResult
		if err == nil {
			res, err = w.s.CompareExchangeAuthority(context.Background(), key, read.Snapshot.StoreVersion, authority.Put([]byte("rewritten")))
		}
		if errors.Is(err, sharded.ErrMoving) {
			w.refused.Add(1)
			if first.IsZero() {
				first = time.Now()
			}
			time.Sleep(5 * time.Millisecond)
			continue
		}
		if err != nil {
			return err
		}
		if res.Kind != authority.KindStored && res.Kind != authority.KindConflict {
			return fmt.Errorf("rewrite %s: %s", key, res.Kind)
		}
		if !first.IsZero() {
			if d := int64(time.Since(first)); d > w.maxRefused.Load() {
				w.maxRefused.Store(d)
			}
		}
		w.writes.Add(1)
		w.mu.Lock()
		if w.marked.Load() {
			w.during = append(w.during, time.Since(start))
		} else {
			w.before = append(w.before, time.Since(start))
		}
		w.mu.Unlock()
		return nil
	}
}

func (w *scaleWriters) mark() { w.marked.Store(true) }

func (w *scaleWriters) stop() {
	close(w.quit)
	w.wg.Wait()
}

// p99 returns the 99th percentile of the write latencies before and during
// the resharding, in milliseconds.
func (w *scaleWriters) p99() (before, during float64) {
	q := func(ds []time.Duration) float64 {
		if len(ds) == 0 {
			return 0
		}
		ds = slices.Clone(ds)
		slices.Sort(ds)
		return float64(ds[len(ds)*99/100]) / float64(time.Millisecond)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return q(w.before), q(w.during)
}
