package etcd_test

import (
	"testing"
	"time"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	"github.com/zlink-systems/authority/internal/testkit/shardtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
)

// liveTTL is the lease of liveness keys the harness marks live; tests end
// long before it.
const liveTTL = 10 * time.Minute

func etcdFactory(t *testing.T) *conformance.Harness {
	clock := authority.NewManualClock(testEpoch)
	claims := &shardtest.Claims{}
	s := newStore(t, nil, etcdstore.Config{Clock: clock, IdentityClaims: claims})
	h := harnessFor(s, clock)
	h.ClaimIdentity = func(_ testing.TB, key authority.Key) { claims.Claim(key) }
	return h
}

// harnessFor returns a harness over s (without identity claims). On an
// external cluster it cannot expire scans (compaction is cluster-wide), so
// the conformance subtests needing that skip.
func harnessFor(s *etcdstore.Store, clock *authority.ManualClock) *conformance.Harness {
	h := &conformance.Harness{
		Store:             s,
		SetLive:           shardtest.SetLive(s, liveTTL),
		SetCapacityPolicy: func(_ testing.TB, p authority.CapacityPolicy) { s.SetCapacityPolicy(p) },
		AdvanceClock:      func(_ testing.TB, d time.Duration) { clock.Advance(d) },
		Now:               clock.Now,
		ExpireScans:       compactNow,
		Relocation:        s.Relocation(),
		RecordRetention:   s.RecordRetention(),
	}
	if etcdtest.External() {
		h.ExpireScans = nil
	}
	return h
}

func TestConformance(t *testing.T) { conformance.RunAll(t.Context(), t, etcdFactory) }

func TestFeedConformance(t *testing.T) { conformance.RunTestFeed(t.Context(), t, etcdFactory) }
