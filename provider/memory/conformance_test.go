package memory

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testEpoch is where every test clock starts.
var testEpoch = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// claimSet is a settable authority.IdentityClaims.
type claimSet struct{ keys map[authority.Key]bool }

func (c *claimSet) IdentityClaimed(key authority.Key) bool { return c.keys[key] }

// newHarness builds a fresh store with every control the harness offers.
func newHarness(t *testing.T) *conformance.Harness { return newHarnessWith(t, nil) }

// newHarnessWith is newHarness with the store's metrics on reg (nil: none).
func newHarnessWith(_ *testing.T, reg prometheus.Registerer) *conformance.Harness {
	live := NewLiveSet()
	clock := authority.NewManualClock(testEpoch)
	store := New(Config{Liveness: live, Clock: clock, Registerer: reg})
	claims := &claimSet{keys: map[authority.Key]bool{}}
	return &conformance.Harness{
		Store: store,
		SetLive: func(_ testing.TB, node authority.NodeDescriptor, gen int64, owner authority.OwnerToken, isLive bool) {
			live.Set(node, gen, owner, isLive)
		},
		SetCapacityPolicy: func(_ testing.TB, p authority.CapacityPolicy) { store.SetCapacityPolicy(p) },
		ClaimIdentity: func(_ testing.TB, key authority.Key) {
			// The store reads claims under its lock; replace the set under it.
			next := &claimSet{keys: map[authority.Key]bool{key: true}}
			for k := range claims.keys {
				next.keys[k] = true
			}
			claims = next
			store.SetIdentityClaims(next)
		},
		AdvanceClock: func(_ testing.TB, d time.Duration) { clock.Advance(d) },
		Now:          clock.Now,
		ExpireScans:  func(testing.TB) { store.ExpireScans() },
		Relocation:   NewRelocationStore(clock),
		// the default: Config.ReservationRetention is not set
		RecordRetention:  DefaultReservationRetention,
		LeaveGenerations: func(_ testing.TB, c conformance.GenerationCounter, left int64) { leaveGenerations(store, c, left) },
	}
}

// leaveGenerations moves counter c of s on so that left values remain
// before authority.MaxGeneration (never back).
func leaveGenerations(s *Store, c conformance.GenerationCounter, left int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	counter := map[conformance.GenerationCounter]*int64{
		conformance.StoreVersions:     &s.storeVersion,
		conformance.ObjectGenerations: &s.objectGeneration,
		conformance.OwnerGenerations:  &s.ownerGeneration,
	}[c]
	*counter = max(*counter, authority.MaxGeneration-left)
}

func TestConformance(t *testing.T) {
	conformance.RunAll(t.Context(), t, newHarness)
}

func TestFeedConformance(t *testing.T) {
	conformance.RunTestFeed(t.Context(), t, newHarness)
}
