package escrow_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/sharded/escrow"
)

// TestEscrowLimitHoldsAcrossShards: one after another, reservations on the
// three shards in turn fill the node to its limit exactly, and the next is
// exhausted on every shard; freeing one slot in one shard lets a
// reservation in another shard take it (its slack is reclaimed).
func TestEscrowLimitHoldsAcrossShards(t *testing.T) {
	const limit = 10
	set := openShards(t, "", setOptions{policy: conformance.ActorLimit(limit)})
	ctx := context.Background()
	var first authority.ReserveResult
	var firstReq authority.ReserveRequest
	for i := range limit {
		req := reserveRequest(authority.ObjectActor, fmt.Sprintf("a%d", i))
		res, err := set.stores[i%shardCount].Reserve(ctx, req)
		require.NoError(t, err)
		require.Equal(t, authority.KindReserved, res.Kind, "reservation %d", i)
		if i == 0 {
			first, firstReq = res, req
		}
	}
	for s := range shardCount {
		res, err := set.stores[s].Reserve(ctx, reserveRequest(authority.ObjectActor, fmt.Sprintf("over-%d", s)))
		require.NoError(t, err)
		require.Equal(t, authority.KindPlacementCapacityExhausted, res.Kind, "shard %d", s)
	}
	_, reserved := set.usage(t, authority.ObjectActor)
	require.Equal(t, int64(limit), reserved)

	// free one slot in shard 0; shard 2 takes it
	key, err := firstReq.Key.Encode()
	require.NoError(t, err)
	ab, err := set.stores[0].Abort(ctx, authority.AbortRequest{Key: firstReq.Key, ReservationID: first.ReservationID,
		ExpectedStoreVersion: first.Creating.StoreVersion, Target: target})
	require.NoError(t, err)
	require.Equal(t, authority.KindAborted, ab.Kind, "abort %s", key)
	res, err := set.stores[2].Reserve(ctx, reserveRequest(authority.ObjectActor, "late"))
	require.NoError(t, err)
	require.Equal(t, authority.KindReserved, res.Kind)
	res, err = set.stores[1].Reserve(ctx, reserveRequest(authority.ObjectActor, "later"))
	require.NoError(t, err)
	require.Equal(t, authority.KindPlacementCapacityExhausted, res.Kind)
	_, reserved = set.usage(t, authority.ObjectActor)
	require.Equal(t, int64(limit), reserved)
	set.requireSettled(t, false)
}

// TestEscrowAggregatePrepareAcrossShards: an aggregate prepared in shard 1
// moving Spots onto a node whose Spots live in shard 0 is held to the
// node's limit over both shards: too large, conflict; within it, prepared
// (its slice grown from the ledger), committed, and the node is full on
// every shard.
func TestEscrowAggregatePrepareAcrossShards(t *testing.T) {
	clock := authority.NewManualClock(testEpoch)
	set := openShards(t, "", setOptions{policy: limits{actors: 100, spots: 5}, clock: clock})
	fx0 := conformance.NewFixture(t, harnessFor(set, 0, clock))
	fx1 := conformance.NewFixture(t, harnessFor(set, 1, clock))
	for i := range 4 {
		fx0.Active(authority.ObjectUserSpot, fmt.Sprintf("a%d", i), conformance.TargetA)
	}
	b1 := fx1.Active(authority.ObjectUserSpot, "b1", conformance.TargetB)
	b2 := fx1.Active(authority.ObjectUserSpot, "b2", conformance.TargetB)
	spots := func(n int64) authority.CapacityVector {
		return authority.CapacityVector{Spots: n, SpotType: &authority.SpotTypeCapacity{ObjectKind: authority.ObjectUserSpot, StableType: conformance.DefaultStableType, Count: n}}
	}
	k1, k2 := fx1.Key(authority.ObjectUserSpot, "b1"), fx1.Key(authority.ObjectUserSpot, "b2")
	both := conformance.AggregateRequest("move-both", 1, conformance.TargetA, spots(2),
		conformance.Participant(k1, b1.StoreVersion, authority.TransitionNewOwner, []byte("b1 moved")),
		conformance.Participant(k2, b2.StoreVersion, authority.TransitionNewOwner, []byte("b2 moved")))
	res, err := set.stores[1].PrepareAggregate(fx1.Ctx(), both)
	require.NoError(t, err)
	require.Equal(t, authority.KindConflict, res.Kind, "4 Spots in shard 0 and 2 more exceed the limit of 5")

	one := conformance.AggregateRequest("move-one", 1, conformance.TargetA, spots(1),
		conformance.Participant(k1, b1.StoreVersion, authority.TransitionNewOwner, []byte("b1 moved")))
	fence := fx1.MustPrepare(one)
	c, err := set.stores[1].CommitAggregate(fx1.Ctx(), fence)
	require.NoError(t, err)
	require.Equal(t, authority.KindCommitted, c.Kind)
	active, reserved := set.usage(t, authority.CounterSpots)
	require.Equal(t, int64(5), active+reserved)
	r, err := set.stores[2].Reserve(fx1.Ctx(), reserveRequest(authority.ObjectUserSpot, "late"))
	require.NoError(t, err)
	require.Equal(t, authority.KindPlacementCapacityExhausted, r.Kind)
	set.requireSettled(t, false)
}

// TestEscrowGroupCommit: 64 concurrent reservations on one shard, with
// room for 40 on the node and part of it left as slack in another shard:
// exactly 40 reserved and 24 exhausted, the refusals decided a batch at a
// time (one refused grow refuses every short request of its shape, not one
// reclaim each).
func TestEscrowGroupCommit(t *testing.T) {
	const limit, requests = 40, 64
	set := openShards(t, "", setOptions{policy: conformance.ActorLimit(limit)})
	ctx := context.Background()
	for i := range 5 { // shard 1 takes a slice (with its chunk) and holds 5
		res, err := set.stores[1].Reserve(ctx, reserveRequest(authority.ObjectActor, fmt.Sprintf("s1-%d", i)))
		require.NoError(t, err)
		require.Equal(t, authority.KindReserved, res.Kind)
	}
	outs := make([]authority.ReserveResult, requests)
	errs := make([]error, requests)
	var wg sync.WaitGroup
	for i := range requests {
		wg.Go(func() {
			outs[i], errs[i] = set.stores[0].Reserve(ctx, reserveRequest(authority.ObjectActor, fmt.Sprintf("s0-%d", i)))
		})
	}
	wg.Wait()
	kinds := map[authority.ResultKind]int{}
	for i := range outs {
		require.NoError(t, errs[i], "request %d", i)
		kinds[outs[i].Kind]++
	}
	require.Equal(t, map[authority.ResultKind]int{authority.KindReserved: limit - 5, authority.KindPlacementCapacityExhausted: requests - (limit - 5)}, kinds)
	_, reserved := set.usage(t, authority.ObjectActor)
	require.Equal(t, int64(limit), reserved)
	st := set.mover.Stats()
	require.LessOrEqual(t, st.Exhausted, int64(4), "refused grows: %+v", st)
	set.requireSettled(t, false)
}

// downShard is a shard's steps while its cluster may be down: every step
// fails with ErrUnavailable while down is set.
type downShard struct {
	escrow.Shard
	down *atomic.Bool
}

var errShardDown = authority.Wrap(authority.ErrUnavailable, "test: the shard's cluster is down", nil)

func (s downShard) check() error {
	if s.down.Load() {
		return errShardDown
	}
	return nil
}

func (s downShard) Slice(ctx context.Context, node authority.NodeDescriptor, lifecycle int64) (etcdstore.SliceState, error) {
	if err := s.check(); err != nil {
		return etcdstore.SliceState{}, err
	}
	return s.Shard.Slice(ctx, node, lifecycle)
}

func (s downShard) Ledger(ctx context.Context, node authority.NodeDescriptor, lifecycle int64) (schema.BudgetLedger, error) {
	if err := s.check(); err != nil {
		return schema.BudgetLedger{}, err
	}
	return s.Shard.Ledger(ctx, node, lifecycle)
}

func (s downShard) Grant(ctx context.Context, node authority.NodeDescriptor, lifecycle int64, shard int, asks ...authority.CapacityVector) (schema.BudgetLedger, error) {
	if err := s.check(); err != nil {
		return schema.BudgetLedger{}, err
	}
	return s.Shard.Grant(ctx, node, lifecycle, shard, asks...)
}

// TestEscrowHomeShardDown: while the node's home shard (its ledger) is
// unreachable, reservations in another shard go on as long as they fit that
// shard's slice, then fail with ErrUnavailable (never over the limit, never
// a refusal); once it is back they go on.
func TestEscrowHomeShardDown(t *testing.T) {
	home := escrow.HomeShard(node, shardCount)
	other := (home + 1) % shardCount
	var down atomic.Bool
	set := openShards(t, "", setOptions{policy: conformance.ActorLimit(100), wrap: func(i int, sh escrow.Shard) escrow.Shard {
		if i == home {
			return downShard{sh, &down}
		}
		return sh
	}})
	ctx := context.Background()
	reserve := func(id string) (authority.ReserveResult, error) {
		return set.stores[other].Reserve(ctx, reserveRequest(authority.ObjectActor, id))
	}
	res, err := reserve("first")
	require.NoError(t, err)
	require.Equal(t, authority.KindReserved, res.Kind)
	st, err := set.stores[other].Budget().Slice(ctx, node, lifecycle)
	require.NoError(t, err)
	room := st.Slice.Size()[schema.BudgetCounter{Kind: authority.ObjectActor}] - 1
	require.Positive(t, room, "the first grow took a chunk: %v", st.Slice)

	down.Store(true)
	for i := range room {
		res, err := reserve(fmt.Sprintf("in-slice-%d", i))
		require.NoError(t, err, "a reservation within the slice needs only its own shard")
		require.Equal(t, authority.KindReserved, res.Kind)
	}
	_, err = reserve("past-slice")
	require.ErrorIs(t, err, authority.ErrUnavailable, "growing the slice needs the home shard")

	down.Store(false)
	res, err = reserve("past-slice")
	require.NoError(t, err)
	require.Equal(t, authority.KindReserved, res.Kind)
	_, reserved := set.usage(t, authority.ObjectActor)
	require.Equal(t, room+2, reserved)
}
