package twophase_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/etcd/storeversion"
)

// lockedBy prepares sc's aggregate and commits it through an instance
// killed at the first call named at (mode), and requires the commit to have
// failed. The killed instance is returned.
func lockedBy(t *testing.T, sc *scenario, mode killMode, at string) *instance {
	t.Helper()
	k := killAt(mode, at)
	a := sc.killed(t, k)
	res, err := sc.prepare(t, a)
	require.NoError(t, err)
	require.Equal(t, authority.KindPrepared, res.Kind)
	_, err = a.coord.CommitAggregate(context.Background(), sc.req.Fence())
	require.Error(t, err, "the killed commit must fail")
	require.True(t, k.killed())
	return a
}

// A coordinator killed between its locks and its decision leaves every
// participant locked, the aggregate prepared. A store of one shard refuses
// to write a locked row (ErrRowLocked, also ErrUnavailable, nothing
// written); a sharded write (Retry) takes the record over, releases the
// lock and writes; the aggregate stays prepared, and its commit is then
// stale (its row changed), as in one store when the write came first.
func TestCASOnRowLockedByUndecidedAggregate(t *testing.T) {
	ctx := context.Background()
	sc := newScenario(t, 3)
	lockedBy(t, sc, killBefore, "Decide")
	require.Equal(t, len(sc.keys), sc.locks(t))
	r1 := sc.keys[1]
	v1 := sc.before[r1].StoreVersion

	_, err := sc.setup.storeOf(r1).CompareExchangeAuthority(ctx, r1, v1, authority.Put([]byte("direct")))
	require.ErrorIs(t, err, etcdstore.ErrRowLocked)
	require.ErrorIs(t, err, authority.ErrUnavailable)
	var locked *etcdstore.RowLockedError
	require.ErrorAs(t, err, &locked)
	require.Equal(t, r1, locked.Locks[0].Key)
	require.Equal(t, sc.req.Fence(), locked.Locks[0].Lock.Fence)
	require.Equal(t, v1, sc.raw(t, r1).StoreVersion, "a refused write changes nothing")

	res, err := sc.store().CompareExchangeAuthority(ctx, r1, v1, authority.Put([]byte("writer")))
	require.NoError(t, err)
	require.Equal(t, authority.KindStored, res.Kind)
	require.Equal(t, schema.AggregatePrepared, sc.record(t).State, "the writer leaves the aggregate prepared")

	commit, err := sc.setup.coord.CommitAggregate(ctx, sc.req.Fence())
	require.NoError(t, err)
	require.Equal(t, authority.KindStale, commit.Kind)
	require.Equal(t, schema.AggregatePrepared, sc.record(t).State, "a stale commit leaves it prepared")
	abort, err := sc.setup.coord.AbortAggregate(ctx, sc.req.Fence())
	require.NoError(t, err)
	require.Equal(t, authority.KindAborted, abort.Kind)
	require.Zero(t, sc.applied(t))
	require.Zero(t, sc.locks(t))
	for _, k := range []int{0, 2} {
		conformance.RequireSameRow(t, sc.before[sc.keys[k]], sc.raw(t, sc.keys[k]))
	}
	sc.fx.RequireUsage(conformance.NodeB, authority.CounterSpots, "", 0, 0)
}

// A coordinator killed right after its decision leaves the aggregate
// committed but applied nowhere. A write of a participant finishes it
// first: it is ordered after the commit, so a CAS at the version before
// is a conflict whose current row holds the aggregate's payload, and every
// other participant is applied too.
func TestCASOnRowLockedByCommittedAggregate(t *testing.T) {
	ctx := context.Background()
	sc := newScenario(t, 3)
	lockedBy(t, sc, killAfter, "Decide")
	rec := sc.record(t)
	require.Equal(t, schema.AggregateCommitted, rec.State)
	require.False(t, rec.Finished)
	require.Zero(t, sc.applied(t), "killed before any apply")

	r1 := sc.keys[1]
	res, err := sc.store().CompareExchangeAuthority(ctx, r1, sc.before[r1].StoreVersion, authority.Put([]byte("writer")))
	require.NoError(t, err)
	require.Equal(t, authority.KindConflict, res.Kind)
	require.Equal(t, sc.payload(r1), res.Current.Snapshot.Payload)
	require.Equal(t, len(sc.keys), sc.applied(t))
	require.True(t, sc.record(t).Finished)

	again, err := sc.setup.coord.CommitAggregate(ctx, sc.req.Fence())
	require.NoError(t, err)
	require.Equal(t, authority.KindAlreadyCommitted, again.Kind)
	sc.check(t, true)
	moved := sc.raw(t, sc.keys[0])
	require.Equal(t, conformance.OwnerB, moved.Owner())
	require.Equal(t, conformance.NodeB, moved.Allocation.Descriptor)
}

// A read of a row locked by a committed aggregate applies the aggregate
// (everywhere) and answers the row after it; a read of a row locked by an
// undecided one answers the row as it is and leaves the lock (a reader
// never ends another's commit).
func TestReadOfLockedRow(t *testing.T) {
	ctx := context.Background()
	t.Run("Committed", func(t *testing.T) {
		sc := newScenario(t, 3)
		lockedBy(t, sc, killAfter, "Decide")
		r2 := sc.keys[2]
		res, err := sc.store().ReadAuthority(ctx, r2)
		require.NoError(t, err)
		require.Equal(t, sc.payload(r2), res.Snapshot.Payload)
		require.Equal(t, len(sc.keys), sc.applied(t), "the read finished the whole aggregate")
		sc.check(t, sc.settle(t))
	})
	t.Run("Undecided", func(t *testing.T) {
		sc := newScenario(t, 3)
		lockedBy(t, sc, killBefore, "Decide")
		r2 := sc.keys[2]
		res, err := sc.store().ReadAuthority(ctx, r2)
		require.NoError(t, err)
		conformance.RequireSameRow(t, sc.before[r2], res.Snapshot)
		require.Equal(t, len(sc.keys), sc.locks(t), "a read leaves the locks")
		// another instance commits it: it takes over the killed attempt
		commit, err := sc.setup.coord.CommitAggregate(ctx, sc.req.Fence())
		require.NoError(t, err)
		require.Equal(t, authority.KindCommitted, commit.Kind)
		require.Contains(t, commit.OwnershipTokens, sc.keys[0])
		require.Equal(t, sc.raw(t, sc.keys[0]).OwnershipToken, commit.OwnershipTokens[sc.keys[0]])
		sc.check(t, true)
	})
}

// RemoveAllByOwner over rows an undecided aggregate locks removes them
// (each lock resolved first) and leaves the aggregate stale.
func TestRemoveAllByOwnerOfLockedRows(t *testing.T) {
	ctx := context.Background()
	sc := newScenario(t, 3)
	lockedBy(t, sc, killBefore, "Decide")
	n, err := sc.store().RemoveAllByOwner(ctx, conformance.OwnerA)
	require.NoError(t, err)
	require.Equal(t, int64(len(sc.keys)), n)
	commit, err := sc.setup.coord.CommitAggregate(ctx, sc.req.Fence())
	require.NoError(t, err)
	require.Equal(t, authority.KindStale, commit.Kind)
	abort, err := sc.setup.coord.AbortAggregate(ctx, sc.req.Fence())
	require.NoError(t, err)
	require.Equal(t, authority.KindAborted, abort.Kind)
	require.Zero(t, sc.locks(t))
	sc.fx.RequireUsage(conformance.NodeA, authority.ObjectActor, "", 0, 0)
	sc.fx.RequireUsage(conformance.NodeB, authority.CounterSpots, "", 0, 0)
}

// Another aggregate over a row an undecided aggregate locks: its commit
// resolves the lock and commits; the first is then stale.
func TestAggregateOverLockedRow(t *testing.T) {
	ctx := context.Background()
	sc := newScenario(t, 3)
	lockedBy(t, sc, killBefore, "Decide")
	r1 := sc.keys[1]
	second := conformance.AggregateRequest("agg-2", 1, conformance.TargetA, conformance.Capacity(authority.ObjectUserSpot, conformance.DefaultStableType),
		conformance.Participant(r1, sc.before[r1].StoreVersion, authority.TransitionNewOwner, []byte("second")),
		conformance.Participant(sc.keys[2], sc.before[sc.keys[2]].StoreVersion, authority.TransitionPreserve, []byte("second")))
	fence := sc.fx.MustPrepare(second)
	res, err := sc.setup.coord.CommitAggregate(ctx, fence)
	require.NoError(t, err)
	require.Equal(t, authority.KindCommitted, res.Kind)
	require.Equal(t, []byte("second"), sc.raw(t, r1).Payload)
	commit, err := sc.setup.coord.CommitAggregate(ctx, sc.req.Fence())
	require.NoError(t, err)
	require.Equal(t, authority.KindStale, commit.Kind)
	abort, err := sc.setup.coord.AbortAggregate(ctx, sc.req.Fence())
	require.NoError(t, err)
	require.Equal(t, authority.KindAborted, abort.Kind)
	require.Zero(t, sc.locks(t))
	require.Equal(t, sc.before[sc.keys[0]].Payload, sc.raw(t, sc.keys[0]).Payload)
}

// An owner the commit needs, not live in one participant shard (its lease
// there lost), fails that shard's lock: the commit releases the other
// shards' locks and is stale, the aggregate still prepared (its abort then
// releases the target's capacity), as a commit in one store whose owner is
// not live.
func TestOwnerNotLiveInOneShard(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		owner authority.CreationTarget
		shard int // the shard of the row whose needed owner dies there
	}{
		{"PreservedOwner", conformance.TargetA, 1},
		{"Target", conformance.TargetB, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc := newScenario(t, 3)
			res, err := sc.prepare(t, sc.setup)
			require.NoError(t, err)
			require.Equal(t, authority.KindPrepared, res.Kind)
			require.Equal(t, tc.shard, sc.c.router.ShardOf(sc.keys[tc.shard]))
			require.NoError(t, sc.setup.stores[tc.shard].MarkDead(ctx, tc.owner.Descriptor(), tc.owner.NodeLifecycleGeneration, tc.owner.Owner))
			commit, err := sc.setup.coord.CommitAggregate(ctx, sc.req.Fence())
			require.NoError(t, err)
			require.Equal(t, authority.KindStale, commit.Kind)
			require.Equal(t, schema.AggregatePrepared, sc.record(t).State)
			require.Zero(t, sc.locks(t), "the stale commit released every lock it took")
			require.Zero(t, sc.applied(t))
			abort, err := sc.setup.coord.AbortAggregate(ctx, sc.req.Fence())
			require.NoError(t, err)
			require.Equal(t, authority.KindAborted, abort.Kind)
			sc.check(t, false)
		})
	}
}

// A cross-shard aggregate needs every shard it touches finalized to
// storeversion.RowLocks: with one participant shard at the version before,
// the prepare is refused (ErrNotFinalized, also ErrInvalidArgument) and
// writes nothing.
func TestCrossShardPrepareNeedsEveryShardFinalized(t *testing.T) {
	ctx := context.Background()
	h, c, in := newHarness(t, newRoundRobin(shardCount), false)
	fx := conformance.NewFixture(t, h)
	old := c.instanceAt(t, 1, storeversion.CompactFormat)
	a1 := fx.Active(authority.ObjectUserSpot, "a1", conformance.TargetA)
	b1 := fx.Active(authority.ObjectUserSpot, "b1", conformance.TargetA)
	req := conformance.AggregateRequest("agg", 1, conformance.TargetB, conformance.Capacity(authority.ObjectUserSpot, conformance.DefaultStableType),
		conformance.Participant(fx.Key(authority.ObjectUserSpot, "a1"), a1.StoreVersion, authority.TransitionNewOwner, nil),
		conformance.Participant(fx.Key(authority.ObjectUserSpot, "b1"), b1.StoreVersion, authority.TransitionPreserve, nil))
	before := fx.State()
	_, err := old.coord.PrepareAggregate(ctx, req)
	require.ErrorIs(t, err, etcdstore.ErrNotFinalized)
	require.ErrorIs(t, err, authority.ErrInvalidArgument)
	fx.RequireState(before)
	rec, err := in.shards[c.router.CoordinatorOf("agg")].ReadRecord(ctx, req.Fence())
	require.NoError(t, err)
	require.Nil(t, rec)
}

// A commit attempt's lock Txn in flight while an abort releases the shards
// can land after it: the rows are unchanged, so its compares hold. Such a
// lock of an aborted aggregate does not block its row until the record
// expires: a writer that meets it releases it (the record says aborted),
// and so does an abort or a commit of the fence, answered as before.
func TestLateLockAfterAbort(t *testing.T) {
	ctx := context.Background()
	for _, then := range []string{"write", "abort", "commit"} {
		t.Run(then, func(t *testing.T) {
			sc := newScenario(t, 3)
			res, err := sc.prepare(t, sc.setup)
			require.NoError(t, err)
			require.Equal(t, authority.KindPrepared, res.Kind)
			prepared := sc.record(t)
			abort, err := sc.setup.coord.AbortAggregate(ctx, sc.req.Fence())
			require.NoError(t, err)
			require.Equal(t, authority.KindAborted, abort.Kind)
			require.True(t, sc.record(t).Finished)

			r1 := sc.keys[1]
			late, err := sc.setup.shards[sc.c.router.ShardOf(r1)].LockParticipants(ctx, prepared, []authority.Key{r1},
				etcdstore.LockAttempt{ID: "0123456789abcdef0123456789abcdef", Base: prepared.Revision})
			require.NoError(t, err)
			require.Equal(t, etcdstore.LockHeld, late.Kind)
			require.Equal(t, 1, sc.locks(t))

			switch then {
			case "write":
				cas, err := sc.store().CompareExchangeAuthority(ctx, r1, sc.before[r1].StoreVersion, authority.Put([]byte("writer")))
				require.NoError(t, err)
				require.Equal(t, authority.KindStored, cas.Kind)
			case "abort":
				again, err := sc.setup.coord.AbortAggregate(ctx, sc.req.Fence())
				require.NoError(t, err)
				require.Equal(t, authority.KindAlreadyAborted, again.Kind)
			default:
				commit, err := sc.setup.coord.CommitAggregate(ctx, sc.req.Fence())
				require.NoError(t, err)
				require.Equal(t, authority.KindStale, commit.Kind)
			}
			require.Zero(t, sc.locks(t))
		})
	}
}
