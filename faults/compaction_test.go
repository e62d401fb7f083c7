package faults_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/embedded"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Compaction and defragmentation run between the pages of listings and
// under waits, while rows keep changing. A listing either completes — every
// row that never changed appears exactly once, keys in order — or ends with
// KindScanExpired; never torn. A WaitForChange started before a compaction
// still sees the change made after it.
func TestCompactionDuringListingsAndWaits(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := embedded.Start(ctx, embedded.Config{ClientAddr: freeAddr(t), AutoCompactionRetention: "0"})
	require.NoError(t, err)
	defer srv.Close()
	s, fx := embeddedStore(t, srv.Endpoint(), "/compaction/")
	raw, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint()}, Logger: zap.NewNop()})
	require.NoError(t, err)
	defer raw.Close()
	target := conformance.Target(conformance.NodeA, conformance.NodeLifecycle, authority.OwnerToken{OwnerID: "o", LeaseGeneration: 1})
	fx.SetLive(target, true)
	const stable, busy = 60, 20
	for i := range stable {
		fx.Active(authority.ObjectUserSpot, fmt.Sprintf("stable-%03d", i), target)
	}
	busyKeys := make([]authority.Key, busy)
	for i := range busyKeys {
		id := fmt.Sprintf("busy-%03d", i)
		fx.Active(authority.ObjectUserSpot, id, target)
		busyKeys[i] = fx.Key(authority.ObjectUserSpot, id)
	}
	compact := func() { compactDefrag(ctx, t, raw, srv.Endpoint()) }
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // rows keep changing
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			k := busyKeys[rand.IntN(busy)]
			if cur, err := s.ReadAuthority(ctx, k); err == nil && cur.Snapshot != nil {
				_, _ = s.CompareExchangeAuthority(ctx, k, cur.Snapshot.StoreVersion, authority.Put([]byte(time.Now().String())))
			}
		}
	}()
	listings, expired, torn := 0, 0, 0
	for n := range 12 {
		seen := map[authority.Key]int{}
		var last authority.Key
		var cursor authority.ScanCursor
		ordered, kind := true, authority.KindPage
		for page := 0; ; page++ {
			res, err := s.ListAuthorities(ctx, "user_spot/", cursor, 7)
			require.NoError(t, err)
			if kind = res.Kind; kind == authority.KindScanExpired {
				break
			}
			for _, it := range res.Items {
				ordered = ordered && it.Key > last
				last = it.Key
				seen[it.Key]++
			}
			if cursor = res.NextCursor; cursor == "" {
				break
			}
			if n%2 == 1 && page == 1 { // every other listing crosses a compaction
				compact()
			}
		}
		listings++
		if kind == authority.KindScanExpired {
			expired++
			continue
		}
		for i := range stable {
			if seen[fx.Key(authority.ObjectUserSpot, fmt.Sprintf("stable-%03d", i))] != 1 {
				torn++
			}
		}
		if !ordered || len(seen) != stable+busy {
			torn++
		}
	}
	close(stop)
	wg.Wait()
	// waits across a compaction
	missed := 0
	for i := range 10 {
		k := busyKeys[i]
		cur, err := s.ReadAuthority(ctx, k)
		require.NoError(t, err)
		done := make(chan error, 1)
		go func() {
			wctx, wcancel := context.WithTimeout(ctx, 15*time.Second)
			defer wcancel()
			done <- s.WaitForChange(wctx, k, cur.Snapshot.StoreVersion)
		}()
		time.Sleep(50 * time.Millisecond)
		compact()
		_, err = s.CompareExchangeAuthority(ctx, k, cur.Snapshot.StoreVersion, authority.Put([]byte("changed")))
		require.NoError(t, err)
		if err := <-done; err != nil {
			missed++
		}
	}
	t.Logf("compaction: listings=%d completed=%d torn=%d scan-expired=%d waits=10 missed=%d", listings, listings-expired, torn, expired, missed)
	require.Zero(t, torn)
	require.Zero(t, missed)
	require.Positive(t, expired, "no listing crossed a compaction (the test cannot fail)")
	require.Positive(t, listings-expired, "no listing completed under writes")
}
