package view_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/embedded"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/preflight"
	"github.com/zlink-systems/authority/view"
)

// listRows is how many rows BenchmarkViewListing lists
// (AUTHORITY_VIEW_ROWS overrides it).
func listRows() int {
	if n, err := strconv.Atoi(os.Getenv("AUTHORITY_VIEW_ROWS")); err == nil && n > 0 {
		return n
	}
	return 100_000
}

// startEmbedded starts an embedded etcd on dir and a store on it.
func startEmbedded(b *testing.B, dir string, fsync bool) (*embedded.Server, *clientv3.Client, *etcdstore.Store) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := embedded.Start(ctx, embedded.Config{Dir: dir, Fsync: fsync, MaxTxnOps: preflight.RecommendedMaxTxnOps,
		MaxRequestBytes: preflight.RecommendedMaxRequestBytes, QuotaBackendBytes: 8 << 30, AutoCompactionRetention: "1000h"})
	require.NoError(b, err)
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint()}, DialTimeout: 10 * time.Second,
		Logger: zap.NewNop(), MaxCallRecvMsgSize: 256 << 20})
	require.NoError(b, err)
	s, err := etcdstore.New(ctx, etcdstore.Config{Client: c, Namespace: "/bench/view/"})
	require.NoError(b, err)
	return srv, c, s
}

// fillReserved reserves n user_spot rows through s with 64 workers.
func fillReserved(b *testing.B, s *etcdstore.Store, n int) {
	tgt := conformance.Target(conformance.NodeA, 1, authority.OwnerToken{OwnerID: "bench", LeaseGeneration: 1})
	require.NoError(b, s.MarkLive(context.Background(), tgt.Descriptor(), 1, tgt.Owner, time.Hour))
	sum := sha256.Sum256([]byte("request"))
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Value
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				res, err := s.Reserve(context.Background(), authority.ReserveRequest{
					Key:             authority.ObjectKey{Kind: authority.ObjectUserSpot, GlobalID: fmt.Sprintf("row-%07d", i)},
					Intent:          authority.CreationIntent{StableType: "t", RequestContentReference: "inline", RequestSHA256: sum[:], RequestEncodedSize: 7},
					Target:          tgt,
					CreatingPayload: []byte("creating-payload-of-a-typical-row-64-bytes-long-0123456789abcdef"),
					Capacity:        authority.CapacityVector{Spots: 1},
				})
				if err == nil && res.Kind != authority.KindReserved {
					err = fmt.Errorf("reserve: %s", res.Kind)
				}
				if err != nil {
					failed.Store(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkViewListing lists 100k rows (pages of MaxScanLimit) from a view
// and from the store (ListAuthorities) on an embedded etcd with fsync on
// (filled with fsync off), reporting rows/s, and reports the view's heap
// bytes per cached row.
func BenchmarkViewListing(b *testing.B) {
	n := listRows()
	dir := b.TempDir()
	srv, c, s := startEmbedded(b, dir, false)
	fillReserved(b, s, n)
	_ = s.Close()
	_ = c.Close()
	srv.Close()
	srv, c, s = startEmbedded(b, dir, true)
	defer srv.Close()
	defer c.Close()
	defer s.Close()

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	v, err := view.New(context.Background(), s, view.Config{Prefix: "user_spot/"})
	require.NoError(b, err)
	defer v.Close()
	runtime.GC()
	runtime.ReadMemStats(&after)
	perRow := float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(n)

	listAll := func(b *testing.B, list func(cursor authority.ScanCursor) (authority.ScanResult, error)) {
		var cursor authority.ScanCursor
		rows := 0
		for {
			res, err := list(cursor)
			require.NoError(b, err)
			require.Equal(b, authority.KindPage, res.Kind)
			rows += len(res.Items)
			if res.NextCursor == "" {
				break
			}
			cursor = res.NextCursor
		}
		require.Equal(b, n, rows)
	}
	b.Run("view", func(b *testing.B) {
		start := time.Now()
		for range b.N {
			listAll(b, func(cur authority.ScanCursor) (authority.ScanResult, error) {
				return v.ListAuthorities(context.Background(), "user_spot/", cur, authority.MaxScanLimit)
			})
		}
		b.ReportMetric(float64(b.N*n)/time.Since(start).Seconds(), "rows/s")
		b.ReportMetric(perRow, "heap-bytes/row")
	})
	b.Run("store", func(b *testing.B) {
		start := time.Now()
		for range b.N {
			listAll(b, func(cur authority.ScanCursor) (authority.ScanResult, error) {
				return s.ListAuthorities(context.Background(), "user_spot/", cur, authority.MaxScanLimit)
			})
		}
		b.ReportMetric(float64(b.N*n)/time.Since(start).Seconds(), "rows/s")
	})
}

// BenchmarkFeedLag measures the lag of a view's feed under 64 clients
// rewriting rows (compare-exchange puts) on an embedded etcd with fsync on:
// from a write's acknowledgement to the view's applying it (0 when the
// view applied it first), reporting p50 and p99.
func BenchmarkFeedLag(b *testing.B) {
	store, h, _ := etcdHarness(b, true)
	fx := conformance.NewFixture(b, h)
	const clients = 64
	keys := make([]authority.Key, clients)
	for i := range keys {
		fx.Active(authority.ObjectUserSpot, fmt.Sprintf("lag-%02d", i), conformance.TargetA)
		keys[i] = fx.Key(authority.ObjectUserSpot, fmt.Sprintf("lag-%02d", i))
	}
	v, err := view.New(b.Context(), store, view.Config{Prefix: "user_spot/"})
	require.NoError(b, err)
	defer v.Close()
	var mu sync.Mutex
	var lags []time.Duration
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := keys[i]
			snap := fx.MustRow(key)
			for next.Add(1) <= int64(b.N) {
				res, err := store.CompareExchangeAuthority(b.Context(), key, snap.StoreVersion, authority.Put([]byte("x")))
				if err != nil || res.Kind != authority.KindStored {
					b.Errorf("put: %v %v", res.Kind, err)
					return
				}
				acked := time.Now()
				rev, _ := strconv.ParseInt(string(res.Snapshot.StoreVersion), 10, 64)
				for v.Revision() < rev {
					time.Sleep(50 * time.Microsecond)
				}
				mu.Lock()
				lags = append(lags, time.Since(acked))
				mu.Unlock()
				snap = res.Snapshot
			}
		}()
	}
	wg.Wait()
	slices.Sort(lags)
	if len(lags) > 0 {
		b.ReportMetric(float64(lags[len(lags)/2].Microseconds()), "p50-µs")
		b.ReportMetric(float64(lags[len(lags)*99/100].Microseconds()), "p99-µs")
	}
}
