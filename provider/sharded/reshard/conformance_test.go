package reshard_test

import (
	"context"
	"testing"
	"time"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	"github.com/zlink-systems/authority/internal/testkit/shardtest"
	"github.com/zlink-systems/authority/provider/sharded"
	"github.com/zlink-systems/authority/provider/sharded/reshard"
)

// resharded returns a conformance harness over a namespace that was grown
// from one shard to three by the job (each subtest's own): the store the
// subtest gets is the one that was open on one shard and followed the map.
func resharded(t *testing.T) *conformance.Harness {
	clock := authority.NewManualClock(testEpoch)
	claims := &shardtest.Claims{}
	cs := clusters(t)
	s := shardtest.Open(t, sharded.Config{Shards: cs[:1], Spares: cs[1:], Clock: clock, IdentityClaims: claims})
	for n := 1; n < clusterCount; n++ {
		grow(t, cs, n, func(c *reshard.Config) { c.LeaseWait, c.AggregateWait = time.Millisecond, time.Millisecond })
	}
	if s.Shards() != clusterCount {
		if _, err := s.ReadAuthority(context.Background(), "actor/probe"); err != nil { // routes once: follows the map
			t.Fatal(err)
		}
	}
	if s.Shards() != clusterCount {
		t.Fatalf("the store did not follow the map: %d shards", s.Shards())
	}
	h := harness(s, clock)
	h.ClaimIdentity = func(_ testing.TB, key authority.Key) { claims.Claim(key) }
	h.ExpireScans = compactAll
	if etcdtest.External() {
		h.ExpireScans = nil
	}
	return h
}

// TestConformanceAfterResharding runs the shared suite on namespaces grown
// from one cluster to three by the resharding job.
func TestConformanceAfterResharding(t *testing.T) {
	conformance.RunAll(t.Context(), t, resharded)
}

// TestFeedConformanceAfterResharding runs the feed suite on them.
func TestFeedConformanceAfterResharding(t *testing.T) {
	conformance.RunTestFeed(t.Context(), t, resharded)
}

// compactAll makes every revision read so far unreadable in every cluster.
func compactAll(t testing.TB) {
	t.Helper()
	etcdtest.Compact(t, clients...)
}
