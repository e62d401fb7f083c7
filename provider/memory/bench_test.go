package memory

import (
	"context"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	authority "github.com/zlink-systems/authority"
)

// BenchmarkMemory measures the hot paths (issue 7 targets: reserve+commit
// ≥ 800k pairs/s, CAS put ≥ 1.7M/s, paging 100k rows ≤ 40 ms, a page at 1M
// rows within 2× of one at 10k).
func BenchmarkMemory(b *testing.B) {
	b.Run("reserve-commit", benchReserveCommit)
	b.Run("reserve-commit-parallel", benchReserveCommitParallel)
	b.Run("cas", benchCAS)
	b.Run("list-100k", benchList100k)
	for _, rows := range []int{10_000, 1_000_000} {
		b.Run("list-page/rows="+strconv.Itoa(rows), func(b *testing.B) { benchListPage(b, rows) })
	}
}

// benchConfig sets the configuration of the stores benchStore makes
// (BenchmarkObservability switches it).
var benchConfig = func(*Config) {}

func benchStore() *Store {
	live := NewLiveSet()
	live.Set(nodeA, 1, ownerA, true)
	opts := Config{Liveness: live}
	benchConfig(&opts)
	return New(opts)
}

// benchRequest is a Spot reservation request on node A; its ID is set per op.
func benchRequest() authority.ReserveRequest {
	return spotRequest("", target(nodeA, ownerA))
}

// populate reserves and commits n Spots with 16-byte payloads.
func populate(b *testing.B, s *Store, n int) {
	b.Helper()
	ctx := context.Background()
	req := benchRequest()
	payload := make([]byte, 16)
	commit := authority.CommitRequest{Key: req.Key, Target: req.Target, ReadyPayload: payload}
	buf := make([]byte, 0, 32)
	for i := range n {
		buf = strconv.AppendInt(append(buf[:0], "spot-"...), int64(i), 10)
		req.Key.GlobalID = string(buf)
		res, err := s.Reserve(ctx, req)
		if err != nil || res.Kind != authority.KindReserved {
			b.Fatalf("reserve: %v %v", res.Kind, err)
		}
		commit.Key, commit.ReservationID, commit.ExpectedStoreVersion = req.Key, res.ReservationID, res.Creating.StoreVersion
		if c, err := s.Commit(ctx, commit); err != nil || c.Kind != authority.KindCommitted {
			b.Fatalf("commit: %v %v", c.Kind, err)
		}
	}
}

// meter measures the wall and CPU time of a benchmark's loop and the page
// faults taken in it. The CPU time (every thread of the process, so the
// collector's work too) is the steadier figure on a shared machine: other
// processes stretch the wall time, not it.
type meter struct {
	wall   time.Time
	cpu    time.Duration
	faults int64
	ok     bool
}

func startMeter() meter {
	cpu, faults, ok := processUsage()
	return meter{wall: time.Now(), cpu: cpu, faults: faults, ok: ok}
}

// usage is what a meter measured.
type usage struct {
	wall, cpu time.Duration
	faults    int64
	// ok is false when cpu and faults are not measured.
	ok bool
}

// elapsed returns what was used since the meter started.
func (m meter) elapsed() usage {
	wall := time.Since(m.wall)
	cpu, faults, ok := processUsage()
	return usage{wall: wall, cpu: cpu - m.cpu, faults: faults - m.faults, ok: ok && m.ok}
}

// reportUsage reports the CPU time and the page faults per op.
func reportUsage(b *testing.B, u usage) {
	if u.ok {
		b.ReportMetric(float64(u.cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
		b.ReportMetric(float64(u.faults)/float64(b.N), "faults/op")
	}
}

// reportRate reports ops/s, the CPU time and the page faults per op.
func reportRate(b *testing.B, m meter) {
	u := m.elapsed()
	b.ReportMetric(float64(b.N)/u.wall.Seconds(), "ops/s")
	reportUsage(b, u)
}

func benchReserveCommit(b *testing.B) {
	s := benchStore()
	ctx := context.Background()
	req := benchRequest()
	commit := authority.CommitRequest{Key: req.Key, Target: req.Target, ReadyPayload: make([]byte, 16)}
	// The IDs are built before the timer: the loop measures the store only.
	ids := make([]string, b.N)
	for i := range ids {
		ids[i] = "spot-" + strconv.Itoa(i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	m := startMeter()
	for i := 0; i < b.N; i++ {
		req.Key.GlobalID = ids[i]
		res, err := s.Reserve(ctx, req)
		if err != nil || res.Kind != authority.KindReserved {
			b.Fatalf("reserve: %v %v", res.Kind, err)
		}
		commit.Key, commit.ReservationID, commit.ExpectedStoreVersion = req.Key, res.ReservationID, res.Creating.StoreVersion
		if c, err := s.Commit(ctx, commit); err != nil || c.Kind != authority.KindCommitted {
			b.Fatalf("commit: %v %v", c.Kind, err)
		}
	}
	reportRate(b, m)
}

// benchReserveCommitParallel is reserve-commit from GOMAXPROCS goroutines
// at once (b.RunParallel) on one store: the throughput of the store's
// callers together, which the store's one lock bounds.
func benchReserveCommitParallel(b *testing.B) {
	s := benchStore()
	ids := make([]string, b.N)
	for i := range ids {
		ids[i] = "spot-" + strconv.Itoa(i)
	}
	var next atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	m := startMeter()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		req := benchRequest()
		commit := authority.CommitRequest{Key: req.Key, Target: req.Target, ReadyPayload: make([]byte, 16)}
		for pb.Next() {
			req.Key.GlobalID = ids[next.Add(1)-1]
			res, err := s.Reserve(ctx, req)
			if err != nil || res.Kind != authority.KindReserved {
				b.Errorf("reserve: %v %v", res.Kind, err)
				return
			}
			commit.Key, commit.ReservationID, commit.ExpectedStoreVersion = req.Key, res.ReservationID, res.Creating.StoreVersion
			if c, err := s.Commit(ctx, commit); err != nil || c.Kind != authority.KindCommitted {
				b.Errorf("commit: %v %v", c.Kind, err)
				return
			}
		}
	})
	reportRate(b, m)
}

func benchCAS(b *testing.B) {
	s := benchStore()
	const rows = 1024
	populate(b, s, rows)
	ctx := context.Background()
	keys := make([]authority.Key, rows)
	versions := make([]authority.StoreVersion, rows)
	for i := range rows {
		keys[i] = authority.Key("user_spot/spot-" + strconv.Itoa(i))
		r, _ := s.ReadAuthority(ctx, keys[i])
		versions[i] = r.Snapshot.StoreVersion
	}
	put := authority.Put(make([]byte, 16))
	b.ReportAllocs()
	b.ResetTimer()
	m := startMeter()
	for i := 0; i < b.N; i++ {
		j := i % rows
		res, err := s.CompareExchangeAuthority(ctx, keys[j], versions[j], put)
		if err != nil || res.Kind != authority.KindStored {
			b.Fatalf("cas: %v %v", res.Kind, err)
		}
		versions[j] = res.Snapshot.StoreVersion
	}
	reportRate(b, m)
}

func benchList100k(b *testing.B) {
	s := benchStore()
	const rows = 100_000
	populate(b, s, rows)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	m := startMeter()
	for i := 0; i < b.N; i++ {
		var cursor authority.ScanCursor
		n := 0
		for {
			res, err := s.ListAuthorities(ctx, "user_spot/", cursor, authority.MaxScanLimit)
			if err != nil || res.Kind != authority.KindPage {
				b.Fatalf("list: %v %v", res.Kind, err)
			}
			n += len(res.Items)
			if cursor = res.NextCursor; cursor == "" {
				break
			}
		}
		if n != rows {
			b.Fatalf("listed %d rows", n)
		}
	}
	u := m.elapsed()
	b.ReportMetric(float64(u.wall.Microseconds())/1e3/float64(b.N), "ms/listing")
	b.ReportMetric(float64(b.N*rows)/u.wall.Seconds(), "rows/s")
	if u.ok {
		b.ReportMetric(float64(u.cpu.Microseconds())/1e3/float64(b.N), "cpu-ms/listing")
		b.ReportMetric(float64(u.faults)/float64(b.N), "faults/listing")
	}
}

// benchListPage measures one 1000-row page from the middle of a listing of
// rows rows, and the heap each row takes.
func benchListPage(b *testing.B, rows int) {
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	s := benchStore()
	populate(b, s, rows)
	runtime.GC()
	runtime.ReadMemStats(&after)
	ctx := context.Background()
	mid := authority.Key("user_spot/spot-" + strconv.Itoa(rows/2))
	first, err := s.ListAuthorities(ctx, "user_spot/", "", 1)
	if err != nil || first.NextCursor == "" {
		b.Fatalf("first page: %v", err)
	}
	pos, err := authority.DecodeScanCursor(first.NextCursor, s.scope, "user_spot/")
	if err != nil {
		b.Fatal(err)
	}
	pos.After = mid
	cursor := authority.EncodeScanCursor(pos)
	page := func() {
		res, err := s.ListAuthorities(ctx, "user_spot/", cursor, authority.MaxScanLimit)
		if err != nil || res.Kind != authority.KindPage || len(res.Items) != authority.MaxScanLimit {
			b.Fatalf("page: %v %v", res.Kind, err)
		}
	}
	// The loop measures pages in the heap's steady state: the pages before
	// the timer run until two collections have passed, so the heap has
	// grown to its goal once and the pages timed reuse its memory. Without
	// this, a short loop at 1M rows pays for the heap's first growth to
	// twice the store (the first touch of every fresh 4 KiB page, ≈ 10 µs a
	// fault on a VM: 20–40 faults a page) and reports that as page cost.
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	for gcs := ms.NumGC; ms.NumGC < gcs+2; runtime.ReadMemStats(&ms) {
		for range 32 {
			page()
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	m := startMeter()
	for i := 0; i < b.N; i++ {
		page()
	}
	b.StopTimer()
	reportUsage(b, m.elapsed())
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(rows), "B/row")
	runtime.KeepAlive(s)
}
