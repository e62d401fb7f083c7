package sharded_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/sharded"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// aggregateIDIn returns an aggregate ID whose coordinator shard is i.
func aggregateIDIn(s *sharded.Store, i int, prefix string) string {
	for n := 0; ; n++ {
		id := fmt.Sprintf("%s-%d", prefix, n)
		if s.CoordinatorOf(id) == i {
			return id
		}
	}
}

// reserveUntilRefused reserves actors on target in shard i until the
// capacity policy refuses one (at most limit+2 tries) and returns how many
// it admitted.
func reserveUntilRefused(t *testing.T, fx *conformance.Fixture, s *sharded.Store, i int, prefix string, target authority.CreationTarget, limit int) int {
	t.Helper()
	for n := 0; n < limit+2; n++ {
		_, id := keyInShard(t, s, i, fmt.Sprintf("%s-%d", prefix, n))
		res, err := s.Reserve(fx.Ctx(), fx.ReserveRequest(authority.ObjectActor, id, target))
		require.NoError(t, err)
		if res.Kind == authority.KindPlacementCapacityExhausted {
			return n
		}
		require.Equal(t, authority.KindReserved, res.Kind)
	}
	t.Fatalf("shard %d admitted %d reservations under a limit of %d", i, limit+2, limit)
	return 0
}

// TestCrossShardCommitKeepsTheLimit: an aggregate across shards whose record
// lives in shard 0 moves a row of shard 1 onto the target. After its commit
// the target holds that row in shard 1, and the limit leaves room for
// exactly one more actor, wherever it is placed: reserving in the record's
// shard until refused admits one. (Were the aggregate's capacity reserved
// in the record's shard alone, that shard would keep the budget after the
// commit while shard 1 holds the row, and admit two.)
func TestCrossShardCommitKeepsTheLimit(t *testing.T) {
	const limit = 2
	s := newStore(t, clusterCount, sharded.Config{CapacityPolicy: conformance.ActorLimit(limit)})
	fx := conformance.NewFixture(t, harnessFor(s, nil))
	a, ra := activeIn(t, fx, s, 1, "mover", conformance.TargetA)
	b, rb := activeIn(t, fx, s, 2, "stayer", conformance.TargetA)
	fence := fx.MustPrepare(conformance.AggregateRequest(aggregateIDIn(s, 0, "limit"), 1, conformance.TargetB, authority.CapacityVector{Actors: 1},
		conformance.Participant(a, ra.StoreVersion, authority.TransitionNewOwner, []byte("a")),
		conformance.Participant(b, rb.StoreVersion, authority.TransitionPreserve, []byte("b"))))
	res, err := s.CommitAggregate(fx.Ctx(), fence)
	require.NoError(t, err)
	require.Equal(t, authority.KindCommitted, res.Kind)
	require.Equal(t, conformance.OwnerB, fx.MustRow(a).Owner())
	require.Equal(t, authority.CapacityUsage{Active: 1}, fx.ActorUsage(conformance.NodeB))

	admitted := reserveUntilRefused(t, fx, s, 0, "after", conformance.TargetB, limit)
	require.Equal(t, limit-1, admitted, "admitted next to the moved row")
	u := fx.ActorUsage(conformance.NodeB)
	require.Equal(t, int64(limit), u.Active+u.Reserved)
	_, err = s.ReconcileEscrow(context.Background(), true)
	require.NoError(t, err)
	require.Equal(t, 0, reserveUntilRefused(t, fx, s, 2, "reclaimed", conformance.TargetB, limit))
}

// TestNoCapacityPolicyRunsNoEscrow: a store of several shards opened with
// NoCapacityPolicy reserves without the escrow (no budget key is written in
// any shard, no grow is asked), refuses a policy at New and at
// SetCapacityPolicy with nothing changed, and still places rows in every
// shard.
func TestNoCapacityPolicyRunsNoEscrow(t *testing.T) {
	shards := shardConfigs(t, clusterCount)
	_, err := sharded.New(context.Background(), sharded.Config{Shards: shards, NoCapacityPolicy: true, CapacityPolicy: conformance.ActorLimit(1)})
	require.ErrorIs(t, err, authority.ErrInvalidArgument)
	s := newStore(t, 0, sharded.Config{Shards: shards, NoCapacityPolicy: true})
	fx := conformance.NewFixture(t, harnessFor(s, nil))
	for i := range clusterCount {
		for n := range 3 {
			_, id := keyInShard(t, s, i, fmt.Sprintf("free-%d", n))
			res, err := s.Reserve(fx.Ctx(), fx.ReserveRequest(authority.ObjectActor, id, conformance.TargetB))
			require.NoError(t, err)
			require.Equal(t, authority.KindReserved, res.Kind)
		}
	}
	require.ErrorIs(t, s.SetCapacityPolicy(fx.Ctx(), conformance.ActorLimit(1)), authority.ErrInvalidArgument)
	require.NoError(t, s.SetCapacityPolicy(fx.Ctx(), nil))
	require.Equal(t, sharded.EscrowStats{}, s.EscrowStats())
	for i, sc := range shards {
		resp, err := sc.Client.Get(context.Background(), schema.Prefix(sc.Namespace, schema.EntryEscrow), clientv3.WithPrefix(), clientv3.WithCountOnly())
		require.NoError(t, err)
		require.Zero(t, resp.Count, "shard %d holds capacity escrow keys", i)
	}
	// with no policy, a fourth actor on the node is admitted in any shard
	_, id := keyInShard(t, s, 0, "free-more")
	res, err := s.Reserve(fx.Ctx(), fx.ReserveRequest(authority.ObjectActor, id, conformance.TargetB))
	require.NoError(t, err)
	require.Equal(t, authority.KindReserved, res.Kind)
}
