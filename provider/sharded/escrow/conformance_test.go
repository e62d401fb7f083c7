package escrow_test

import (
	"context"
	"testing"
	"time"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	"github.com/zlink-systems/authority/internal/testkit/shardtest"
)

var testEpoch = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// escrowFactory is a harness over shard 0's store of a namespace spread
// over the three shards in escrow mode: every capacity decision goes
// through the budget slice and the mover, whose ledger may be in another
// shard. Setting a policy sets it on every shard and reclaims every slice's
// slack (as a policy change must, escrow's package comment).
func escrowFactory(t *testing.T) *conformance.Harness {
	clock := authority.NewManualClock(testEpoch)
	claims := &shardtest.Claims{}
	set := openShards(t, "", setOptions{clock: clock, claims: claims})
	h := harnessFor(set, 0, clock)
	h.ClaimIdentity = func(_ testing.TB, key authority.Key) { claims.Claim(key) }
	return h
}

// harnessFor is a harness over shard i's store of set.
func harnessFor(set *shardSet, i int, clock *authority.ManualClock) *conformance.Harness {
	s := set.stores[i]
	return &conformance.Harness{
		Store:   s,
		SetLive: shardtest.SetLive(s, liveTTL),
		SetCapacityPolicy: func(t testing.TB, p authority.CapacityPolicy) {
			t.Helper()
			for _, st := range set.stores {
				st.SetCapacityPolicy(p)
			}
			if _, err := set.mover.ReconcileAll(context.Background(), true); err != nil {
				t.Fatalf("reclaim after a policy change: %v", err)
			}
		},
		AdvanceClock:    func(_ testing.TB, d time.Duration) { clock.Advance(d) },
		Now:             clock.Now,
		ExpireScans:     compactShard0,
		Relocation:      s.Relocation(),
		RecordRetention: s.RecordRetention(),
	}
}

// compactShard0 compacts shard 0's server at a new revision.
func compactShard0(t testing.TB) {
	t.Helper()
	etcdtest.Compact(t, servers[0].Client(t))
}

// TestConformanceInEscrowMode: the whole shared suite on one shard of a
// namespace in escrow mode: the budget fence changes no outcome the
// contract specifies.
func TestConformanceInEscrowMode(t *testing.T) {
	conformance.RunAll(t.Context(), t, escrowFactory)
}
