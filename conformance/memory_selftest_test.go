package conformance_test

import (
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/provider/memory"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// claims is a set of claimed keys.
type claims struct {
	mu   sync.Mutex
	keys map[authority.Key]bool
}

func (c *claims) IdentityClaimed(key authority.Key) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.keys[key]
}

// memoryFactory runs the suite against provider/memory, so the suite itself
// is exercised in this package.
func memoryFactory(t *testing.T) *conformance.Harness {
	live := memory.NewLiveSet()
	clock := authority.NewManualClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	c := &claims{keys: map[authority.Key]bool{}}
	s := memory.New(memory.Config{Liveness: live, Clock: clock, IdentityClaims: c})
	return &conformance.Harness{
		Store: s,
		SetLive: func(_ testing.TB, node authority.NodeDescriptor, gen int64, owner authority.OwnerToken, on bool) {
			live.Set(node, gen, owner, on)
		},
		SetCapacityPolicy: func(_ testing.TB, p authority.CapacityPolicy) { s.SetCapacityPolicy(p) },
		ClaimIdentity: func(_ testing.TB, key authority.Key) {
			c.mu.Lock()
			c.keys[key] = true
			c.mu.Unlock()
		},
		AdvanceClock: func(_ testing.TB, d time.Duration) { clock.Advance(d) },
		Now:          clock.Now,
		ExpireScans:  func(testing.TB) { s.ExpireScans() },
		Relocation:   memory.NewRelocationStore(clock),
		// the default: Config.ReservationRetention is not set
		RecordRetention: memory.DefaultReservationRetention,
	}
}

func TestConformanceMemory(t *testing.T) { conformance.RunAll(t.Context(), t, memoryFactory) }
