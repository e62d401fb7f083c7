package reshard_test

import (
	"context"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	"github.com/zlink-systems/authority/provider/sharded"
	"github.com/zlink-systems/authority/provider/sharded/reshard"
)

// resharded returns a conformance harness over a namespace that was grown
// from one shard to three by the job (each subtest's own): the store the
// subtest gets is the one that was open on one shard and followed the map.
func resharded(t *testing.T) *conformance.Harness {
	clock := authority.NewManualClock(testEpoch)
	claims := &claimSet{}
	cs := clusters(t)
	s, err := sharded.New(context.Background(), sharded.Config{Shards: cs[:1], Spares: cs[1:], Clock: clock, IdentityClaims: claims})
	if err != nil {
		t.Fatalf("new sharded store: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
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
	h.ClaimIdentity = func(_ testing.TB, key authority.Key) { claims.claim(key) }
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
	etcdtest.SkipIfExternal(t, "compacting expires scans but would compact every key of the cluster")
	ctx := context.Background()
	for _, c := range clients {
		probe := etcdtest.Namespace() + "compaction-probe"
		if _, err := c.Put(ctx, probe, ""); err != nil {
			t.Fatal(err)
		}
		resp, err := c.Delete(ctx, probe)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
			t.Fatal(err)
		}
	}
}

// claimSet is a concurrency-safe authority.IdentityClaims.
type claimSet struct {
	mu   sync.Mutex
	keys map[authority.Key]bool
}

func (c *claimSet) IdentityClaimed(key authority.Key) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.keys[key]
}

func (c *claimSet) claim(key authority.Key) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.keys == nil {
		c.keys = map[authority.Key]bool{}
	}
	c.keys[key] = true
}
