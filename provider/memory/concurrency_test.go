package memory

import (
	"encoding/binary"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
)

// TestConcurrentReserveOneWinner: N goroutines reserve the same key; exactly
// one wins, every other sees a conflict with the winner's row.
func TestConcurrentReserveOneWinner(t *testing.T) {
	e := newEnv(t)
	const n = 64
	results := make([]authority.ReserveResult, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			res, err := e.s.Reserve(e.ctx, spotRequest("contended", target(nodeA, ownerA)))
			if err != nil {
				t.Error(err)
			}
			results[i] = res
		}()
	}
	close(start)
	wg.Wait()
	var winner *authority.ReserveResult
	for i := range results {
		if results[i].Kind == authority.KindReserved {
			require.Nil(t, winner, "two winners")
			winner = &results[i]
		}
	}
	require.NotNil(t, winner)
	for _, r := range results {
		if r.Kind != authority.KindReserved {
			require.Equal(t, authority.KindConflict, r.Kind)
			require.Equal(t, winner.Creating.StoreVersion, r.Current.Snapshot.StoreVersion)
		}
	}
	require.Equal(t, authority.CapacityUsage{Reserved: 1}, e.usage(nodeA, authority.ObjectUserSpot, "chat"))
}

// TestConcurrentCASRetry: N goroutines each add one to a counter in a row's
// payload with a read-modify-write CAS loop; the final count is N.
func TestConcurrentCASRetry(t *testing.T) {
	e := newEnv(t)
	key, _ := e.spot("counter")
	const n, perGoroutine = 32, 50
	var wg sync.WaitGroup
	var conflicts [n]int
	for g := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range perGoroutine {
				for {
					cur, err := e.s.ReadAuthority(e.ctx, key)
					if err != nil {
						t.Error(err)
						return
					}
					count := uint64(0)
					if len(cur.Snapshot.Payload) == 8 {
						count = binary.BigEndian.Uint64(cur.Snapshot.Payload)
					}
					next := binary.BigEndian.AppendUint64(nil, count+1)
					res, err := e.s.CompareExchangeAuthority(e.ctx, key, cur.Snapshot.StoreVersion, authority.Put(next))
					if err != nil {
						t.Error(err)
						return
					}
					if res.Kind == authority.KindStored {
						break
					}
					if res.Kind != authority.KindConflict {
						t.Errorf("unexpected %s", res.Kind)
						return
					}
					conflicts[g]++
				}
			}
		}()
	}
	wg.Wait()
	final := e.read(key).Snapshot.Payload
	require.Equal(t, uint64(n*perGoroutine), binary.BigEndian.Uint64(final))
}

// TestConcurrentCapacityNeverOverAdmits: many goroutines reserve distinct
// keys on one node under a policy of 10 Spots: exactly 10 are admitted.
func TestConcurrentCapacityNeverOverAdmits(t *testing.T) {
	e := newEnv(t, func(o *Config) { o.CapacityPolicy = maxSpots(10) })
	const n = 100
	var wg sync.WaitGroup
	var mu sync.Mutex
	kinds := map[authority.ResultKind]int{}
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := e.s.Reserve(e.ctx, spotRequest(string(rune('a'+i%26))+string(rune('a'+i/26)), target(nodeA, ownerA)))
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			kinds[res.Kind]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	require.Equal(t, map[authority.ResultKind]int{authority.KindReserved: 10, authority.KindPlacementCapacityExhausted: n - 10}, kinds)
	require.Equal(t, authority.CapacityUsage{Reserved: 10}, e.usage(nodeA, authority.ObjectUserSpot, "chat"))
}
