package view_test

import (
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/provider/memory"
	"github.com/zlink-systems/authority/view"
)

func TestViewConcurrentReadsMemory(t *testing.T) {
	_, h := memoryHarness(t, memory.Config{})
	testViewConcurrentReads(t, h)
}

func TestViewConcurrentReadsEtcd(t *testing.T) {
	_, h, _ := etcdHarness(t, false)
	testViewConcurrentReads(t, h)
}

// testViewConcurrentReads has one writer put 1, 2, 3, ... into a row while
// 16 readers read it from the view: a consistent read that begins after a
// put returned sees that put or a later one (never an earlier value), so
// reads sharing one revision request stay linearizable.
func testViewConcurrentReads(t *testing.T, h *conformance.Harness) {
	fx := conformance.NewFixture(t, h)
	key := fx.Key(authority.ObjectUserSpot, "counter")
	snap := fx.Active(authority.ObjectUserSpot, "counter", conformance.TargetA)
	v := newView(t, h, view.Config{})
	var acked atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var reads atomic.Int64
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				floor := acked.Load()
				r, err := v.Read(fx.Ctx(), key, view.Freshness{})
				if err != nil {
					t.Errorf("read: %v", err)
					return
				}
				got, _ := strconv.ParseInt(string(r.Snapshot.Payload), 10, 64)
				if got < floor {
					t.Errorf("read %d after put %d returned", got, floor)
					return
				}
				reads.Add(1)
			}
		}()
	}
	deadline := time.Now().Add(time.Second)
	for n := int64(1); time.Now().Before(deadline) || reads.Load() < 100; n++ {
		require.Less(t, time.Since(deadline), time.Minute, "the readers made no progress")
		snap = fx.Put(key, snap.StoreVersion, []byte(strconv.FormatInt(n, 10)))
		acked.Store(n)
	}
	close(stop)
	wg.Wait()
	t.Logf("%d consistent reads, %d puts", reads.Load(), acked.Load())
}
