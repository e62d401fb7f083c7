package sharded_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/provider/sharded"
)

// activeIn places an active actor in shard i of s and returns its key and
// row.
func activeIn(t testing.TB, fx *conformance.Fixture, s *sharded.Store, i int, name string, target authority.CreationTarget) (authority.Key, *authority.Snapshot) {
	t.Helper()
	key, id := keyInShard(t, s, i, name)
	return key, fx.Active(authority.ObjectActor, id, target)
}

// TestAggregateOfOneShard: an aggregate whose participants share a shard is
// that shard's: prepared by one store, committed by another store of the
// same shards (which finds the record), its rows moved together.
func TestAggregateOfOneShard(t *testing.T) {
	ctx := context.Background()
	shards := shardConfigs(t, clusterCount)
	s := newStore(t, 0, sharded.Config{Shards: shards})
	other := newStore(t, 0, sharded.Config{Shards: shards})
	fx := conformance.NewFixture(t, harnessFor(s, nil))
	a, ra := activeIn(t, fx, s, 2, "mover-a", conformance.TargetA)
	b, rb := activeIn(t, fx, s, 2, "mover-b", conformance.TargetA)
	fence := fx.MustPrepare(conformance.AggregateRequest("one-shard", 1, conformance.TargetB, authority.CapacityVector{Actors: 2},
		conformance.Participant(a, ra.StoreVersion, authority.TransitionNewOwner, []byte("a")),
		conformance.Participant(b, rb.StoreVersion, authority.TransitionNewOwner, []byte("b"))))
	for i := range shards {
		has, err := s.Shard(i).HasAggregate(ctx, fence)
		require.NoError(t, err)
		require.Equal(t, i == 2, has, "shard %d", i)
	}
	res, err := other.CommitAggregate(ctx, fence)
	require.NoError(t, err)
	require.Equal(t, authority.KindCommitted, res.Kind)
	res, err = s.CommitAggregate(ctx, fence)
	require.NoError(t, err)
	require.Equal(t, authority.KindAlreadyCommitted, res.Kind)
	for _, k := range []authority.Key{a, b} {
		require.Equal(t, conformance.OwnerB, fx.MustRow(k).Owner())
	}
}

// TestAggregateAcrossShardsIsRefused: a store configured to refuse
// aggregates across shards answers one with participants in two shards
// ErrInvalidArgument (and ErrCrossShardAggregate) naming the shards and
// keys; nothing is written.
func TestAggregateAcrossShardsIsRefused(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, clusterCount, sharded.Config{RefuseCrossShardAggregates: true})
	fx := conformance.NewFixture(t, harnessFor(s, nil))
	a, ra := activeIn(t, fx, s, 0, "left", conformance.TargetA)
	b, rb := activeIn(t, fx, s, 1, "right", conformance.TargetA)
	before := fx.State()
	req := conformance.AggregateRequest("across", 1, conformance.TargetB, authority.CapacityVector{Actors: 1},
		conformance.Participant(a, ra.StoreVersion, authority.TransitionNewOwner, []byte("a")),
		conformance.Participant(b, rb.StoreVersion, authority.TransitionPreserve, []byte("b")))
	_, err := s.PrepareAggregate(ctx, req)
	require.ErrorIs(t, err, authority.ErrInvalidArgument)
	require.ErrorIs(t, err, sharded.ErrCrossShardAggregate)
	require.ErrorContains(t, err, "shards [0 1]")
	require.ErrorContains(t, err, "shard 0: "+string(a))
	require.ErrorContains(t, err, "shard 1: "+string(b))
	fx.RequireState(before)
	for i := range clusterCount {
		has, err := s.Shard(i).HasAggregate(ctx, req.Fence())
		require.NoError(t, err)
		require.False(t, has)
	}
}

// TestOneFenceOneRecord: a fence prepared in one shard is another request's
// in any other shard, of one shard or across shards (whose record would go
// to the fence's coordinator shard): preparing it there is a conflict, and
// writes nothing.
func TestOneFenceOneRecord(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, clusterCount, sharded.Config{})
	fx := conformance.NewFixture(t, harnessFor(s, nil))
	a, ra := activeIn(t, fx, s, 0, "first", conformance.TargetA)
	b, rb := activeIn(t, fx, s, 1, "second", conformance.TargetA)
	id := aggregateIDIn(s, 2, "shared-fence")
	fence := fx.MustPrepare(conformance.AggregateRequest(id, 1, conformance.TargetB, authority.CapacityVector{Actors: 1},
		conformance.Participant(a, ra.StoreVersion, authority.TransitionNewOwner, []byte("a"))))
	before := fx.State()
	for name, req := range map[string]authority.AggregatePrepareRequest{
		"of another shard": conformance.AggregateRequest(id, 1, conformance.TargetB, authority.CapacityVector{Actors: 1},
			conformance.Participant(b, rb.StoreVersion, authority.TransitionNewOwner, []byte("b"))),
		"across shards": conformance.AggregateRequest(id, 1, conformance.TargetB, authority.CapacityVector{Actors: 1},
			conformance.Participant(a, ra.StoreVersion, authority.TransitionPreserve, []byte("a")),
			conformance.Participant(b, rb.StoreVersion, authority.TransitionNewOwner, []byte("b"))),
	} {
		res, err := s.PrepareAggregate(ctx, req)
		require.NoError(t, err, name)
		require.Equal(t, authority.KindConflict, res.Kind, name)
		fx.RequireState(before)
		for _, i := range []int{1, 2} {
			has, err := s.Shard(i).HasAggregate(ctx, fence)
			require.NoError(t, err)
			require.False(t, has, "%s: shard %d", name, i)
		}
	}
}
