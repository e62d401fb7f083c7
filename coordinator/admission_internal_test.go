package coordinator

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/provider/memory"
)

// slowReserve makes each Reserve take a millisecond, so callers overlap in
// the Spot's gate.
type slowReserve struct{ authority.Store }

func (s slowReserve) Reserve(ctx context.Context, req authority.ReserveRequest) (authority.ReserveResult, error) {
	time.Sleep(time.Millisecond)
	return s.Store.Reserve(ctx, req)
}

// Under sustained contention on one Spot the gate never drains, yet settled
// admissions do not pile up: each goes once the callers that entered before
// it settled have left.
func TestGateForgetsSettledAdmissionsUnderContention(t *testing.T) {
	live := memory.NewLiveSet()
	owner := authority.OwnerToken{OwnerID: "owner-a", LeaseGeneration: 1}
	live.Set(authority.NodeDescriptor{MeshName: "mesh", RID: "node-a"}, 1, owner, true)
	st := memory.New(memory.Config{Liveness: live})
	target := Target{MeshName: "mesh", NodeRID: "node-a", NodeGeneration: 1, Owner: owner, IsLocal: true}
	c, err := NewUserSpotCoordinator(UserSpotOptions{Store: slowReserve{st}, Placement: func(context.Context, CreateRequest, map[string]bool) (Target, bool, error) {
		return target, true, nil
	}})
	require.NoError(t, err)
	mat := func(context.Context, Target, *authority.Snapshot) (Materialized, error) {
		return Materialized{State: Rejected}, nil
	}
	stop := time.Now().Add(time.Second)
	var wg sync.WaitGroup
	var mu sync.Mutex
	created := 0
	for range 8 {
		wg.Go(func() {
			for time.Now().Before(stop) {
				res, err := c.GetOrCreate(context.Background(), CreateRequest{SpotID: "hot", StableType: "t", Timeout: 5 * time.Second}, mat, nil)
				if err == nil && res.State == Rejected {
					mu.Lock()
					created++
					mu.Unlock()
				}
			}
		})
	}
	maxLocal := 0
	for time.Now().Before(stop) {
		c.mu.Lock()
		maxLocal = max(maxLocal, len(c.local))
		c.mu.Unlock()
		time.Sleep(2 * time.Millisecond)
	}
	wg.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	t.Logf("%d creations; at most %d local admissions held", created, maxLocal)
	require.Greater(t, created, 50)
	require.LessOrEqual(t, maxLocal, 16, "settled admissions piled up")
	require.Empty(t, c.local)
	require.Empty(t, c.gates)
}
