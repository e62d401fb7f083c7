package sharded_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
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

// TestAggregateAcrossShardsIsRefused: without the cross-shard protocol an
// aggregate with participants in two shards is ErrInvalidArgument (and
// ErrCrossShardAggregate) naming the shards and keys; nothing is written.
func TestAggregateAcrossShardsIsRefused(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, clusterCount, sharded.Config{})
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
// in any other shard: preparing it there is a conflict, and writes nothing.
func TestOneFenceOneRecord(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, clusterCount, sharded.Config{})
	fx := conformance.NewFixture(t, harnessFor(s, nil))
	a, ra := activeIn(t, fx, s, 0, "first", conformance.TargetA)
	b, rb := activeIn(t, fx, s, 1, "second", conformance.TargetA)
	fx.MustPrepare(conformance.AggregateRequest("shared-fence", 1, conformance.TargetB, authority.CapacityVector{Actors: 1},
		conformance.Participant(a, ra.StoreVersion, authority.TransitionNewOwner, []byte("a"))))
	before := fx.State()
	res, err := s.PrepareAggregate(ctx, conformance.AggregateRequest("shared-fence", 1, conformance.TargetB, authority.CapacityVector{Actors: 1},
		conformance.Participant(b, rb.StoreVersion, authority.TransitionNewOwner, []byte("b"))))
	require.NoError(t, err)
	require.Equal(t, authority.KindConflict, res.Kind)
	fx.RequireState(before)
	has, err := s.Shard(1).HasAggregate(ctx, authority.Fence{AggregateID: "shared-fence", AggregateGeneration: 1})
	require.NoError(t, err)
	require.False(t, has)
}

// crossShardRecorder is a CrossShardAggregates that records what the store
// hands it and owns the fences it prepared: it tests the seam's wiring
// (which aggregates go to it, with which shards, and how commit and abort
// find it), not a protocol.
type crossShardRecorder struct {
	mu       sync.Mutex
	bound    int
	prepared map[authority.Fence][]int
	calls    []string
	closed   bool
}

func (r *crossShardRecorder) Bind(_ context.Context, shards []*etcdstore.Store, shardOf func(authority.Key) int) error {
	r.bound, r.prepared = len(shards), map[authority.Fence][]int{}
	return nil
}

func (r *crossShardRecorder) Prepare(_ context.Context, req authority.AggregatePrepareRequest, shards []int) (authority.PrepareAggregateResult, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.prepared[req.Fence()] = shards
	r.calls = append(r.calls, fmt.Sprintf("prepare %s %v", req.AggregateID, shards))
	return authority.PrepareAggregateResult{Kind: authority.KindPrepared, Fence: req.Fence()}, nil
}

func (r *crossShardRecorder) Commit(_ context.Context, f authority.Fence) (authority.CommitAggregateResult, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, "commit "+f.AggregateID)
	return authority.CommitAggregateResult{Kind: authority.KindCommitted}, nil
}

func (r *crossShardRecorder) Abort(_ context.Context, f authority.Fence) (authority.AbortAggregateResult, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, "abort "+f.AggregateID)
	return authority.AbortAggregateResult{Kind: authority.KindAborted}, nil
}

func (r *crossShardRecorder) Owns(_ context.Context, f authority.Fence) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.prepared[f]
	return ok, nil
}

func (r *crossShardRecorder) Close() error { r.closed = true; return nil }

// TestCrossShardSeam: with Config.CrossShard, an aggregate across shards goes
// to it with its shards, commit and abort of a fence it owns go to it, and
// an aggregate of one shard stays on that shard's store.
func TestCrossShardSeam(t *testing.T) {
	ctx := context.Background()
	rec := &crossShardRecorder{}
	shards := shardConfigs(t, clusterCount)
	s, err := sharded.New(ctx, sharded.Config{Shards: shards, CrossShard: rec})
	require.NoError(t, err)
	fx := conformance.NewFixture(t, harnessFor(s, nil))
	require.Equal(t, clusterCount, rec.bound)
	a, ra := activeIn(t, fx, s, 0, "x", conformance.TargetA)
	b, rb := activeIn(t, fx, s, 2, "y", conformance.TargetA)
	c, rc := activeIn(t, fx, s, 2, "z", conformance.TargetA)
	across := conformance.AggregateRequest("across", 1, conformance.TargetB, authority.CapacityVector{Actors: 1},
		conformance.Participant(a, ra.StoreVersion, authority.TransitionNewOwner, []byte("a")),
		conformance.Participant(b, rb.StoreVersion, authority.TransitionPreserve, []byte("b")))
	fence := fx.MustPrepare(across)
	cres, err := s.CommitAggregate(ctx, fence)
	require.NoError(t, err)
	require.Equal(t, authority.KindCommitted, cres.Kind)
	ares, err := s.AbortAggregate(ctx, fence)
	require.NoError(t, err)
	require.Equal(t, authority.KindAborted, ares.Kind)
	local := fx.MustPrepare(conformance.AggregateRequest("local", 1, conformance.TargetB, authority.CapacityVector{Actors: 1},
		conformance.Participant(b, rb.StoreVersion, authority.TransitionNewOwner, []byte("b")),
		conformance.Participant(c, rc.StoreVersion, authority.TransitionPreserve, []byte("c"))))
	cres, err = s.CommitAggregate(ctx, local)
	require.NoError(t, err)
	require.Equal(t, authority.KindCommitted, cres.Kind)
	require.Equal(t, []string{"prepare across [0 2]", "commit across", "abort across"}, rec.calls)
	require.NoError(t, s.Close())
	require.True(t, rec.closed)
}
