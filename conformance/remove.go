package conformance

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
)

// RunTestRemoveAllByOwner checks RemoveAllByOwner on active and reserved
// rows, its count, its effect on capacity, and that it touches nothing else.
func RunTestRemoveAllByOwner(ctx context.Context, t *testing.T, f Factory) {
	remove := func(t *testing.T, fx *Fixture, owner authority.OwnerToken) int64 {
		t.Helper()
		n, err := fx.Store().RemoveAllByOwner(fx.Ctx(), owner)
		require.NoError(t, err)
		return n
	}
	runSubtests(ctx, t, f, []subtest{
		{"RemovesActiveRows", func(t *testing.T, fx *Fixture) {
			fx.Active(authority.ObjectActor, "a1", TargetA)
			fx.Active(authority.ObjectActor, "a2", TargetA)
			fx.RequireUsage(NodeA, authority.ObjectActor, "", 2, 0)
			require.Equal(t, int64(2), remove(t, fx, OwnerA))
			fx.RequireMissing(fx.Key(authority.ObjectActor, "a1"))
			fx.RequireMissing(fx.Key(authority.ObjectActor, "a2"))
			fx.RequireUsage(NodeA, authority.ObjectActor, "", 0, 0)
		}},
		{"RemovesReservedRows", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			fx.RequireUsage(NodeA, authority.ObjectUserSpot, DefaultStableType, 0, 1)
			require.Equal(t, int64(1), remove(t, fx, OwnerA))
			fx.RequireMissing(r.Key)
			fx.RequireUsage(NodeA, authority.ObjectUserSpot, DefaultStableType, 0, 0)
			fx.RequireUsage(NodeA, authority.CounterSpots, "", 0, 0)
		}},
		{"RemovesMixedRows", func(t *testing.T, fx *Fixture) {
			fx.Active(authority.ObjectActor, "a1", TargetA)
			fx.Reserve(authority.ObjectActor, "a2", TargetA)
			fx.Active(authority.ObjectUserSpot, "s1", TargetA)
			fx.Reserve(authority.ObjectInstanceSpot, "i1", TargetA)
			require.Equal(t, int64(4), remove(t, fx, OwnerA))
			require.Empty(t, fx.State().Rows)
			for _, u := range fx.State().Usage {
				require.Equal(t, authority.CapacityUsage{}, u)
			}
		}},
		{"RemovesRowsOnEveryNode", func(t *testing.T, fx *Fixture) {
			// The owner token alone selects the rows, whatever node
			// or lifecycle generation they are on; each row's capacity is
			// released on its own node lifecycle.
			onB := Target(NodeB, NodeLifecycle, OwnerA)
			nextLife := Target(NodeA, NodeLifecycle+1, OwnerA)
			fx.SetLive(onB, true)
			fx.SetLive(nextLife, true)
			fx.Active(authority.ObjectActor, "a1", TargetA)
			fx.Reserve(authority.ObjectActor, "a2", onB)
			fx.Active(authority.ObjectUserSpot, "s1", onB)
			fx.Active(authority.ObjectActor, "a3", nextLife)
			fx.Reserve(authority.ObjectUserSpot, "s2", nextLife)
			kept := fx.Active(authority.ObjectActor, "b1", TargetB)
			require.Equal(t, int64(5), remove(t, fx, OwnerA))
			s := fx.State()
			require.Len(t, s.Rows, 1)
			RequireSameRow(t, kept, fx.MustRow(b1Key(fx)))
			fx.RequireUsage(NodeA, authority.ObjectActor, "", 0, 0)
			fx.RequireUsage(NodeB, authority.ObjectActor, "", 1, 0)
			fx.RequireUsage(NodeB, authority.CounterSpots, "", 0, 0)
			fx.RequireUsage(NodeB, authority.ObjectUserSpot, DefaultStableType, 0, 0)
			for _, kind := range []authority.ObjectKind{authority.ObjectActor, authority.CounterSpots} {
				require.Equal(t, authority.CapacityUsage{}, fx.Usage(NodeA, NodeLifecycle+1, kind, ""), "%s at lifecycle %d", kind, NodeLifecycle+1)
			}
			require.Equal(t, authority.CapacityUsage{}, fx.Usage(NodeA, NodeLifecycle+1, authority.ObjectUserSpot, DefaultStableType))
			require.Zero(t, remove(t, fx, OwnerA))
		}},
		{"LeavesOtherOwners", func(t *testing.T, fx *Fixture) {
			fx.Active(authority.ObjectActor, "a1", TargetA)
			fx.Active(authority.ObjectActor, "b1", TargetB)
			rb := fx.Reserve(authority.ObjectActor, "b2", TargetB)
			b1 := fx.MustRow(fx.Key(authority.ObjectActor, "b1"))
			require.Equal(t, int64(1), remove(t, fx, OwnerA))
			RequireSameRow(t, b1, fx.MustRow(b1Key(fx)))
			RequireSameRow(t, rb.Res.Creating, fx.MustRow(rb.Key))
			fx.RequireUsage(NodeB, authority.ObjectActor, "", 1, 1)
		}},
		{"LeavesOtherLeaseGenerations", func(t *testing.T, fx *Fixture) {
			lease2 := authority.OwnerToken{OwnerID: OwnerA.OwnerID, LeaseGeneration: 2}
			t2 := Target(NodeA, NodeLifecycle, lease2)
			fx.SetLive(t2, true)
			fx.Active(authority.ObjectActor, "a1", TargetA)
			s2 := fx.Active(authority.ObjectActor, "a2", t2)
			require.Equal(t, int64(1), remove(t, fx, OwnerA))
			RequireSameRow(t, s2, fx.MustRow(fx.Key(authority.ObjectActor, "a2")))
		}},
		{"NothingToRemove", func(t *testing.T, fx *Fixture) {
			fx.Active(authority.ObjectActor, "b1", TargetB)
			before := fx.State()
			require.Zero(t, remove(t, fx, OwnerA))
			fx.RequireState(before)
		}},
		{"SecondCallRemovesNothing", func(t *testing.T, fx *Fixture) {
			fx.Active(authority.ObjectActor, "a1", TargetA)
			require.Equal(t, int64(1), remove(t, fx, OwnerA))
			require.Zero(t, remove(t, fx, OwnerA))
		}},
		{"WorksWithDeadOwner", func(t *testing.T, fx *Fixture) {
			fx.Active(authority.ObjectActor, "a1", TargetA)
			fx.SetLive(TargetA, false)
			require.Equal(t, int64(1), remove(t, fx, OwnerA))
		}},
		{"SourceRowsOfPreparedAggregate", func(t *testing.T, fx *Fixture) {
			// RemoveAllByOwner removes the owner's rows and nothing else: the
			// prepared aggregate and the target capacity it reserved stay,
			// its commit is stale (a participant is missing), its abort
			// releases the capacity.
			m := newMove(fx)
			fence := fx.MustPrepare(m.req)
			fx.SetLive(TargetA, false)
			require.Equal(t, int64(1), remove(t, fx, OwnerA))
			fx.RequireMissing(m.a1Key)
			RequireSameRow(t, m.b1, fx.MustRow(m.b1Key))
			fx.RequireUsage(NodeA, authority.ObjectActor, "", 0, 0)
			fx.RequireUsage(NodeB, authority.ObjectActor, "", 1, 1)
			before := fx.State()
			require.Equal(t, authority.KindStale, commitAggregateKind(t, fx, fence))
			require.Equal(t, authority.KindAlreadyPrepared, prepareKind(t, fx, m.req))
			fx.RequireState(before)
			require.Equal(t, authority.KindAborted, abortAggregateKind(t, fx, fence))
			fx.RequireUsage(NodeB, authority.ObjectActor, "", 1, 0)
			require.Equal(t, authority.KindStale, commitAggregateKind(t, fx, fence))
			require.Equal(t, authority.KindConflict, prepareKind(t, fx, m.req))
		}},
		{"TargetRowsOfPreparedAggregate", func(t *testing.T, fx *Fixture) {
			// The target owner's preserve participant goes; the capacity the
			// aggregate reserved on the target is no row's and stays.
			m := newMove(fx)
			fence := fx.MustPrepare(m.req)
			require.Equal(t, int64(1), remove(t, fx, OwnerB))
			fx.RequireMissing(m.b1Key)
			fx.RequireUsage(NodeB, authority.ObjectActor, "", 0, 1)
			before := fx.State()
			require.Equal(t, authority.KindStale, commitAggregateKind(t, fx, fence))
			fx.RequireState(before)
			RequireSameRow(t, m.a1, fx.MustRow(m.a1Key))
			require.Equal(t, authority.KindAborted, abortAggregateKind(t, fx, fence))
			fx.RequireUsage(NodeB, authority.ObjectActor, "", 0, 0)
		}},
		{"RecreatedParticipantDoesNotRevivePreparedAggregate", func(t *testing.T, fx *Fixture) {
			m := newMove(fx)
			fence := fx.MustPrepare(m.req)
			require.Equal(t, int64(1), remove(t, fx, OwnerA))
			again := fx.Active(authority.ObjectActor, "a1", TargetA)
			require.Equal(t, authority.KindStale, commitAggregateKind(t, fx, fence))
			RequireSameRow(t, again, fx.MustRow(m.a1Key))
			fx.RequireUsage(NodeA, authority.ObjectActor, "", 1, 0)
			fx.RequireUsage(NodeB, authority.ObjectActor, "", 1, 1)
		}},
		{"OtherOwnerLeavesPreparedAggregate", func(t *testing.T, fx *Fixture) {
			m := newMove(fx)
			c := Target(NodeA, NodeLifecycle, authority.OwnerToken{OwnerID: "owner-c", LeaseGeneration: 1})
			fx.SetLive(c, true)
			fx.Active(authority.ObjectActor, "c1", c)
			fence := fx.MustPrepare(m.req)
			require.Equal(t, int64(1), remove(t, fx, c.Owner))
			require.Equal(t, authority.KindCommitted, commitAggregateKind(t, fx, fence))
			require.Equal(t, OwnerB, fx.MustRow(m.a1Key).Owner())
			fx.RequireUsage(NodeA, authority.ObjectActor, "", 0, 0)
			fx.RequireUsage(NodeB, authority.ObjectActor, "", 2, 0)
		}},
		{"KeyCanBeReservedAgain", func(t *testing.T, fx *Fixture) {
			s := fx.Active(authority.ObjectActor, "a1", TargetA)
			require.Equal(t, int64(1), remove(t, fx, OwnerA))
			r := fx.Reserve(authority.ObjectActor, "a1", TargetB)
			require.Greater(t, r.Res.Creating.ObjectGeneration, s.ObjectGeneration)
		}},
	})
}

func b1Key(fx *Fixture) authority.Key { return fx.Key(authority.ObjectActor, "b1") }
