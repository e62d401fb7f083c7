package reshard_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/sharded/reshard"
)

// TestSingleClusterStoreStopsAtTheGrowth: a single-cluster store (a plain
// etcd.Store, not a shard of a sharded store) already writing on the one
// cluster a resharding grows from is not lost track of: its reservations
// go through while the job copies, and from the freeze on every one fails
// with ErrShardedNamespace (ErrUnavailable), so no write it acknowledged
// is left behind in the cluster the rows left: each one reads back through
// a store over the grown map.
func TestSingleClusterStoreStopsAtTheGrowth(t *testing.T) {
	ctx := context.Background()
	cs := clusters(t)
	s := openStore(t, cs, 1, 1, nil)
	lease, err := s.Registry().Acquire(ctx, conformance.NodeA, 1, "plain-owner", 20*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { _ = lease.Close(context.Background()) })
	fx := conformance.NewFixture(t, harness(s, nil))
	target := conformance.Target(conformance.NodeA, 1, lease.Token())
	plain, err := etcdstore.New(ctx, etcdstore.Config{Client: cs[0].Client, Namespace: cs[0].Namespace})
	require.NoError(t, err)
	defer func() { _ = plain.Close() }()

	var (
		mu      sync.Mutex
		acked   []authority.Key
		stopErr error
		wg      sync.WaitGroup
	)
	stop := make(chan struct{})
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			req := fx.ReserveRequest(authority.ObjectActor, fmt.Sprintf("plain-%d", i), target)
			res, err := plain.Reserve(ctx, req)
			mu.Lock()
			switch {
			case err == nil && res.Kind == authority.KindReserved:
				key, err := req.Key.Encode()
				if err != nil {
					stopErr = err
				}
				acked = append(acked, key)
			case errors.Is(err, etcdstore.ErrShardedNamespace):
				stopErr = err
			case err != nil && !errors.Is(err, authority.ErrUnavailable):
				stopErr = fmt.Errorf("unexpected: %w", err)
			}
			done := stopErr != nil
			mu.Unlock()
			if done {
				return
			}
			time.Sleep(2 * time.Millisecond) // a node's pace, not a saturating loop the copy would chase
		}
	})
	// the plain store writes before the job starts (bounded)
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		mu.Lock()
		n := len(acked)
		mu.Unlock()
		if n >= 20 {
			break
		}
	}
	p := grow(t, cs, 1, func(c *reshard.Config) { c.LeaseWait = 100 * time.Millisecond })
	// the plain store's next write after the freeze fails (bounded)
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		mu.Lock()
		done := stopErr != nil
		mu.Unlock()
		if done {
			break
		}
	}
	close(stop)
	wg.Wait()
	require.ErrorIs(t, stopErr, etcdstore.ErrShardedNamespace)
	require.ErrorIs(t, stopErr, authority.ErrUnavailable)
	require.GreaterOrEqual(t, len(acked), 20, "the plain store wrote before the job")
	require.NotZero(t, p.Rows)
	require.Eventually(t, func() bool { return s.Shards() == 2 }, time.Minute, 10*time.Millisecond)
	moved := 0
	for _, key := range acked {
		r, err := s.ReadAuthority(ctx, key)
		require.NoError(t, err)
		require.Equal(t, authority.KindSnapshot, r.Kind, "acknowledged reservation %s reads back from the grown map", key)
		if s.ShardOf(key) == 1 {
			moved++
		}
	}
	require.NotZero(t, moved, "some acknowledged reservations moved to the new cluster")
	_, err = plain.ReadAuthority(ctx, acked[0])
	require.ErrorIs(t, err, etcdstore.ErrShardedNamespace, "its row reads stop too")
	t.Logf("plain-store-at-growth: acked=%d moved=%d rows=%d stopped-with=%q", len(acked), moved, p.Rows, stopErr)
}
