package twophase_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/provider/sharded/twophase"
)

// factory returns a conformance factory of sharded stores over the three
// clusters, each harness on fresh namespaces routed by a new router.
// Capacity policies are left out across shards (SetCapacityPolicy nil: the
// policy subtests skip): each shard judges a placement by its own entries,
// and a node's capacity across shards is the capacity escrow's (issue 42).
func factory(router func() twophase.Router, policies bool) conformance.Factory {
	return func(t *testing.T) *conformance.Harness {
		h, _, _ := newHarness(t, router(), policies)
		return h
	}
}

// newHarness returns a conformance harness over a new instance on new
// namespaces, with the cluster and the instance.
func newHarness(t testing.TB, router twophase.Router, policies bool) (*conformance.Harness, *cluster, *instance) {
	c := newCluster(t, router)
	in := c.instance(t, nil)
	spreadRevisions(t, c)
	h := &conformance.Harness{
		Store: testStore{in},
		SetLive: func(t testing.TB, node authority.NodeDescriptor, lifecycle int64, owner authority.OwnerToken, live bool) {
			in.setLive(t, node, lifecycle, owner, live)
		},
		SetCapacityPolicy: func(_ testing.TB, p authority.CapacityPolicy) {
			for _, s := range in.stores {
				s.SetCapacityPolicy(p)
			}
		},
		AdvanceClock:    func(_ testing.TB, d time.Duration) { c.clock.Advance(d) },
		Now:             c.clock.Now,
		RecordRetention: in.stores[0].RecordRetention(),
	}
	if !policies {
		h.SetCapacityPolicy = nil
	}
	return h, c, in
}

// spreadRevisions moves each shard's etcd revision at least revisionGap
// past the one before it. A row's StoreVersion is its shard's revision, so
// rows of two shards can share one; the conformance subtest
// ConflictAnyFieldDiffers/ParticipantVersion takes b1's version as a
// version a1 cannot have. A sharded store tells its shards' versions apart
// (package provider/sharded); this harness passes raw versions, so it keeps
// the shards' revisions apart instead.
func spreadRevisions(t testing.TB, c *cluster) {
	t.Helper()
	ctx := context.Background()
	const revisionGap = 500
	var prev int64
	for i := range shared {
		scratch := c.namespaces[i] + "revision-spread"
		for {
			resp, err := shared[i].Put(ctx, scratch, "")
			require.NoError(t, err)
			if i == 0 || resp.Header.Revision >= prev+revisionGap {
				prev = resp.Header.Revision
				break
			}
		}
	}
}

// TestAggregateConformanceAcrossShards runs the conformance suite's
// aggregate areas (and the areas with aggregates in them) on three clusters, each fixture's first rows in two
// shards and the aggregate's record in the third: every aggregate with
// rows in two shards goes through the two-phase protocol and must answer as
// a store of one cluster does.
func TestAggregateConformanceAcrossShards(t *testing.T) {
	f := factory(func() twophase.Router { return newRoundRobin(shardCount) }, false)
	t.Run("AggregatePrepare", func(t *testing.T) { conformance.RunTestAggregatePrepare(t.Context(), t, f) })
	t.Run("AggregateCommit", func(t *testing.T) { conformance.RunTestAggregateCommit(t.Context(), t, f) })
	t.Run("AggregateAbort", func(t *testing.T) { conformance.RunTestAggregateAbort(t.Context(), t, f) })
	t.Run("AggregatePolicy", func(t *testing.T) { conformance.RunTestAggregatePolicy(t.Context(), t, f) })
	// the other areas with aggregates in them (their other subtests run
	// through the harness's store: single-row operations in one shard)
	t.Run("Concurrency", func(t *testing.T) { conformance.RunTestConcurrency(t.Context(), t, f) })
	t.Run("OwnershipToken", func(t *testing.T) { conformance.RunTestOwnershipToken(t.Context(), t, f) })
	t.Run("Retention", func(t *testing.T) { conformance.RunTestRetention(t.Context(), t, f) })
	t.Run("RemoveAllByOwner", func(t *testing.T) { conformance.RunTestRemoveAllByOwner(t.Context(), t, f) })
	t.Run("Context", func(t *testing.T) { conformance.RunTestContext(t.Context(), t, f) })
}

// TestAggregateConformanceOneShard runs the same areas with every row and
// record in one shard: the coordinator's path for an aggregate wholly in
// its coordinator shard (one Txn, as one store).
func TestAggregateConformanceOneShard(t *testing.T) {
	f := factory(func() twophase.Router { return oneShard{} }, true)
	t.Run("AggregatePrepare", func(t *testing.T) { conformance.RunTestAggregatePrepare(t.Context(), t, f) })
	t.Run("AggregateCommit", func(t *testing.T) { conformance.RunTestAggregateCommit(t.Context(), t, f) })
	t.Run("AggregateAbort", func(t *testing.T) { conformance.RunTestAggregateAbort(t.Context(), t, f) })
	t.Run("AggregatePolicy", func(t *testing.T) { conformance.RunTestAggregatePolicy(t.Context(), t, f) })
}
