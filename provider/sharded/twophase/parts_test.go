package twophase_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/sharded/twophase"
)

// spotsOnB returns the Spot usage of NodeB in each shard.
func spotsOnB(t testing.TB, in *instance) []authority.CapacityUsage {
	t.Helper()
	out := make([]authority.CapacityUsage, len(in.stores))
	for i, s := range in.stores {
		u, err := s.CapacityUsage(context.Background(), conformance.NodeB, conformance.NodeLifecycle, authority.CounterSpots, "")
		require.NoError(t, err)
		out[i] = u
	}
	return out
}

// The scenario's aggregate moves r0 (shard 0) onto TargetB, its record in
// shard 2. Its prepare reserves the Spot in shard 0, where the commit moves
// it, not in the record's shard; the commit turns that reservation into
// r0's own entry; an abort releases it, and a reservation of the aborted
// incarnation that comes late (a stalled coordinator) writes nothing.
func TestPartsAreReservedWhereTheCommitMovesCapacity(t *testing.T) {
	ctx := context.Background()
	for _, commit := range []bool{true, false} {
		sc := newScenario(t, 3)
		before := spotsOnB(t, sc.setup)
		res, err := sc.prepare(t, sc.setup)
		require.NoError(t, err)
		require.Equal(t, authority.KindPrepared, res.Kind)
		prepared := spotsOnB(t, sc.setup)
		require.Equal(t, before[0].Reserved+1, prepared[0].Reserved, "the part in r0's shard")
		require.Equal(t, before[2], prepared[2], "nothing in the record's shard: none of its rows moves")
		rec := sc.record(t)
		if commit {
			out, err := sc.setup.coord.CommitAggregate(ctx, sc.req.Fence())
			require.NoError(t, err)
			require.Equal(t, authority.KindCommitted, out.Kind)
		} else {
			out, err := sc.setup.coord.AbortAggregate(ctx, sc.req.Fence())
			require.NoError(t, err)
			require.Equal(t, authority.KindAborted, out.Kind)
			kind, err := sc.setup.shards[0].ReservePart(ctx, rec, sc.keys[:1])
			require.NoError(t, err)
			require.Equal(t, etcdstore.PartFinished, kind, "a late reservation of the aborted incarnation")
		}
		sc.check(t, commit)
		after := spotsOnB(t, sc.setup)
		for i := range after {
			require.Zero(t, after[i].Reserved, "shard %d", i)
		}
	}
}

// A prepare refused in a participant shard (its capacity policy admits no
// Spot on NodeB) is a conflict that leaves nothing: no record, no capacity
// reserved anywhere; once the policy admits it, the same request is
// prepared and committed.
func TestPrepareRefusedInAParticipantShardLeavesNothing(t *testing.T) {
	ctx := context.Background()
	sc := newScenario(t, 3)
	sc.setup.stores[0].SetCapacityPolicy(conformance.CapacityPolicyFunc(func(node authority.NodeDescriptor, _, _, _ authority.CapacityVector) bool {
		return node != conformance.NodeB
	}))
	before := sc.fx.State()
	res, err := sc.prepare(t, sc.setup)
	require.NoError(t, err)
	require.Equal(t, authority.KindConflict, res.Kind)
	sc.fx.RequireState(before)
	require.Nil(t, sc.record(t), "the refused prepare's record is withdrawn")
	commit, err := sc.setup.coord.CommitAggregate(ctx, sc.req.Fence())
	require.NoError(t, err)
	require.Equal(t, authority.KindStale, commit.Kind)

	sc.setup.stores[0].SetCapacityPolicy(nil)
	res, err = sc.prepare(t, sc.setup)
	require.NoError(t, err)
	require.Equal(t, authority.KindPrepared, res.Kind)
	commit, err = sc.setup.coord.CommitAggregate(ctx, sc.req.Fence())
	require.NoError(t, err)
	require.Equal(t, authority.KindCommitted, commit.Kind)
	sc.check(t, true)
}

// A coordinator that stopped between the record and the part it reserves in
// a participant shard leaves the aggregate prepared without that part: a
// lock of that shard is stale until the part is there, and a commit by
// another instance reserves it first, then commits.
func TestCommitReservesThePartsOfAStoppedPrepare(t *testing.T) {
	ctx := context.Background()
	sc := newScenario(t, 3)
	k := killAt(killBefore, "ReservePart")
	_, err := sc.prepare(t, sc.killed(t, k))
	require.ErrorIs(t, err, authority.ErrUnavailable)
	require.True(t, k.killed())
	rec := sc.record(t)
	require.NotNil(t, rec)
	require.Equal(t, schema.AggregatePrepared, rec.State)
	require.Zero(t, spotsOnB(t, sc.setup)[0].Reserved, "no part in r0's shard")
	lock, err := sc.setup.shards[0].LockParticipants(ctx, rec, sc.keys[:1], etcdstore.LockAttempt{ID: "0123456789abcdef0123456789abcdef", Base: rec.Revision})
	require.NoError(t, err)
	require.Equal(t, etcdstore.LockStale, lock.Kind, "a shard whose part is missing cannot be locked")
	require.Zero(t, sc.locks(t))

	res, err := sc.setup.coord.CommitAggregate(ctx, sc.req.Fence())
	require.NoError(t, err)
	require.Equal(t, authority.KindCommitted, res.Kind)
	sc.check(t, true)
}

// hookShard runs before(name) ahead of each call of the names it hooks.
type hookShard struct {
	twophase.Shard
	before func(name string)
}

func (h hookShard) ReservePart(ctx context.Context, rec *etcdstore.CrossRecord, keys []authority.Key) (etcdstore.PartKind, error) {
	h.before("ReservePart")
	return h.Shard.ReservePart(ctx, rec, keys)
}

// Another instance that read the record while it was prepared, and so
// remembers it, answers a commit and an abort of the fence stale once the
// refused prepare withdrew it (not an error naming a cross-shard record).
func TestWithdrawnRecordRememberedPreparedIsStale(t *testing.T) {
	ctx := context.Background()
	sc := newScenario(t, 3)
	other := sc.c.instance(t, nil)
	sc.setup.stores[0].SetCapacityPolicy(conformance.CapacityPolicyFunc(func(node authority.NodeDescriptor, _, _, _ authority.CapacityVector) bool {
		return node != conformance.NodeB
	}))
	ci := sc.c.router.CoordinatorOf(sc.req.AggregateID)
	refusing := sc.setup.with(func(shards []twophase.Shard) []twophase.Shard {
		out := append([]twophase.Shard(nil), shards...)
		out[0] = hookShard{Shard: shards[0], before: func(string) {
			rec, err := other.shards[ci].ReadRecord(ctx, sc.req.Fence())
			require.NoError(t, err)
			require.Equal(t, schema.AggregatePrepared, rec.State)
		}}
		return out
	})
	res, err := sc.prepare(t, refusing)
	require.NoError(t, err)
	require.Equal(t, authority.KindConflict, res.Kind)
	commit, err := other.coord.CommitAggregate(ctx, sc.req.Fence())
	require.NoError(t, err)
	require.Equal(t, authority.KindStale, commit.Kind)
	abort, err := other.coord.AbortAggregate(ctx, sc.req.Fence())
	require.NoError(t, err)
	require.Equal(t, authority.KindStale, abort.Kind)
}
