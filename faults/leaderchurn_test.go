package faults_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/etcdcluster"
)

// Leaders are killed and restarted while an owner lease is held and its
// owner writes. No write of the owner is acknowledged after the deadline its
// lease promised (OwnerLease.Deadline, when Done closes at the latest), and
// the figure says how far the elections (lease checkpointing off) extended a
// plain etcd lease left to expire.
func TestLeaderChurnWithOwnerLeases(t *testing.T) {
	c, cli := startCluster(t, etcdcluster.Options{})
	s := newStore(t, cli, "")
	ctx := settle(t)
	lease, err := s.Registry().Acquire(ctx, conformance.NodeA, conformance.NodeLifecycle, "churned", 3*time.Second)
	require.NoError(t, err)
	defer lease.Close(context.Background())
	target := conformance.Target(conformance.NodeA, conformance.NodeLifecycle, lease.Token())
	probe, err := cli.Grant(ctx, 10) // expires unless elections extend it
	require.NoError(t, err)
	granted := time.Now()

	var mu sync.Mutex
	acked, afterDeadline := 0, 0
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for n := 0; ; n++ {
			select {
			case <-stop:
				return
			default:
			}
			wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			res, err := s.Reserve(wctx, reserveRequest(authority.ObjectUserSpot, fmt.Sprintf("churn-%d", n), target, "c"))
			cancel()
			ackedAt := time.Now()
			if err == nil && res.Kind == authority.KindReserved {
				mu.Lock()
				acked++
				if ackedAt.After(lease.Deadline().Add(time.Second)) { // a second of clock slack between the two reads
					afterDeadline++
				}
				mu.Unlock()
			}
		}
	}()
	elections := 0
	for range 3 {
		time.Sleep(700 * time.Millisecond) // the owner writes between elections
		leader, err := c.Leader(ctx)
		require.NoError(t, err)
		require.NoError(t, c.Kill(leader))
		require.NoError(t, c.WaitHealthy(ctx)) // the others elect a leader
		require.NoError(t, c.Restart(leader))
		require.NoError(t, c.WaitHealthy(ctx))
		elections++
	}
	time.Sleep(700 * time.Millisecond)
	close(stop)
	wg.Wait()
	ttl, err := cli.TimeToLive(ctx, probe.ID)
	require.NoError(t, err)
	extension := time.Duration(ttl.TTL)*time.Second - (10*time.Second - time.Since(granted))
	t.Logf("leader-churn: elections=%d owner-writes-acked=%d writes-after-deadline=%d lease-extension=%.1fs (probe lease TTL 10 s, checkpointing off)",
		elections, acked, afterDeadline, extension.Seconds())
	require.Positive(t, acked, "the owner never wrote (the test cannot fail)")
	require.Zero(t, afterDeadline)
}
