package conformance

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
)

// RunTestGenerationExhausted checks generationExhausted: a write that needs
// a store version, object generation or owner generation past
// authority.MaxGeneration reports it and changes nothing, after every other
// check of the operation; operations that take no new value (abort,
// prepareAggregate, abortAggregate, removeAllByOwner, reads) still work.
// It needs Harness.LeaveGenerations.
func RunTestGenerationExhausted(ctx context.Context, t *testing.T, f Factory) {
	// leave moves counter c to left remaining values.
	leave := func(t *testing.T, fx *Fixture, c GenerationCounter, left int64) {
		t.Helper()
		needGenerations(t, fx)
		fx.H.LeaveGenerations(t, c, left)
	}
	// exhausted requires call to report generationExhausted and change
	// nothing.
	exhausted := func(t *testing.T, fx *Fixture, call func() authority.ResultKind) {
		t.Helper()
		before := fx.State()
		require.Equal(t, authority.KindGenerationExhausted, call())
		fx.RequireState(before)
	}
	reserve := func(t *testing.T, fx *Fixture, req authority.ReserveRequest) authority.ReserveResult {
		t.Helper()
		res, err := fx.Store().Reserve(fx.Ctx(), req)
		require.NoError(t, err)
		return res
	}
	commit := func(t *testing.T, fx *Fixture, req authority.CommitRequest) authority.CommitResult {
		t.Helper()
		res, err := fx.Store().Commit(fx.Ctx(), req)
		require.NoError(t, err)
		return res
	}
	complete := func(t *testing.T, fx *Fixture, req authority.CompleteCreationRequest) authority.CompleteCreationResult {
		t.Helper()
		res, err := fx.Store().CompleteCreation(fx.Ctx(), req)
		require.NoError(t, err)
		return res
	}
	cas := func(t *testing.T, fx *Fixture, key authority.Key, v authority.StoreVersion, m authority.Mutation) authority.CompareExchangeResult {
		t.Helper()
		res, err := fx.Store().CompareExchangeAuthority(fx.Ctx(), key, v, m)
		require.NoError(t, err)
		return res
	}
	// Reserve takes one value of each counter (store version,
	// object generation and owner generation each up to MaxGeneration).
	reserveExhausted := func(c GenerationCounter) func(t *testing.T, fx *Fixture) {
		return func(t *testing.T, fx *Fixture) {
			leave(t, fx, c, 0)
			exhausted(t, fx, func() authority.ResultKind {
				res := reserve(t, fx, fx.ReserveRequest(authority.ObjectUserSpot, "s1", TargetA))
				require.Nil(t, res.Creating)
				require.Empty(t, res.ReservationID)
				return res.Kind
			})
			fx.RequireMissing(fx.Key(authority.ObjectUserSpot, "s1"))
		}
	}
	reserveLast := func(c GenerationCounter) func(t *testing.T, fx *Fixture) {
		return func(t *testing.T, fx *Fixture) {
			leave(t, fx, c, 1)
			fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			exhausted(t, fx, func() authority.ResultKind {
				return reserve(t, fx, fx.ReserveRequest(authority.ObjectUserSpot, "s2", TargetA)).Kind
			})
		}
	}
	runSubtests(ctx, t, f, []subtest{
		{"ReserveStoreVersion", reserveExhausted(StoreVersions)},
		{"ReserveObjectGeneration", reserveExhausted(ObjectGenerations)},
		{"ReserveOwnerGeneration", reserveExhausted(OwnerGenerations)},
		{"ReserveTakesLastStoreVersion", reserveLast(StoreVersions)},
		{"ReserveTakesLastObjectGeneration", reserveLast(ObjectGenerations)},
		{"ReserveTakesLastOwnerGeneration", reserveLast(OwnerGenerations)},
		{"ReserveChecksRowsTargetAndCapacityFirst", func(t *testing.T, fx *Fixture) {
			// Reserve checks the identity claim, the existing row, the
			// target and the capacity before the counters.
			needGenerations(t, fx)
			fx.Active(authority.ObjectUserSpot, "s1", TargetA)
			fx.Reserve(authority.ObjectUserSpot, "s2", TargetA)
			for _, c := range []GenerationCounter{StoreVersions, ObjectGenerations, OwnerGenerations} {
				leave(t, fx, c, 0)
			}
			before := fx.State()
			require.Equal(t, authority.KindAlreadyExists, reserve(t, fx, fx.ReserveRequest(authority.ObjectUserSpot, "s1", TargetA)).Kind)
			require.Equal(t, authority.KindConflict, reserve(t, fx, fx.ReserveRequest(authority.ObjectUserSpot, "s2", TargetA)).Kind)
			other := fx.ReserveRequest(authority.ObjectUserSpot, "s1", TargetA)
			other.Intent.StableType = "type-b"
			other.Capacity = Capacity(authority.ObjectUserSpot, "type-b")
			require.Equal(t, authority.KindTypeMismatch, reserve(t, fx, other).Kind)
			dead := Target(NodeA, NodeLifecycle, authority.OwnerToken{OwnerID: "owner-dead", LeaseGeneration: 1})
			require.Equal(t, authority.KindConflict, reserve(t, fx, fx.ReserveRequest(authority.ObjectUserSpot, "s3", dead)).Kind)
			if fx.H.SetCapacityPolicy != nil {
				fx.H.SetCapacityPolicy(t, CapacityPolicyFunc(func(authority.NodeDescriptor, authority.CapacityVector, authority.CapacityVector, authority.CapacityVector) bool {
					return false
				}))
				require.Equal(t, authority.KindPlacementCapacityExhausted, reserve(t, fx, fx.ReserveRequest(authority.ObjectUserSpot, "s3", TargetA)).Kind)
				fx.H.SetCapacityPolicy(t, nil)
			}
			require.Equal(t, authority.KindGenerationExhausted, reserve(t, fx, fx.ReserveRequest(authority.ObjectUserSpot, "s3", TargetA)).Kind)
			fx.RequireState(before)
		}},
		{"Commit", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			leave(t, fx, StoreVersions, 0)
			exhausted(t, fx, func() authority.ResultKind {
				res := commit(t, fx, r.CommitRequest([]byte("ready")))
				require.Nil(t, res.Ready)
				return res.Kind
			})
			RequireSameRow(t, r.Res.Creating, fx.MustRow(r.Key))
			// Abort takes no version: the reservation can still be released.
			res, err := fx.Store().Abort(fx.Ctx(), r.AbortRequest())
			require.NoError(t, err)
			require.Equal(t, authority.KindAborted, res.Kind)
			fx.RequireMissing(r.Key)
			fx.RequireUsage(NodeA, authority.ObjectUserSpot, DefaultStableType, 0, 0)
		}},
		{"CommitTakesLastStoreVersion", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			leave(t, fx, StoreVersions, 1)
			fx.MustCommit(r, []byte("ready"))
			active := fx.MustRow(r.Key)
			exhausted(t, fx, func() authority.ResultKind {
				return cas(t, fx, r.Key, active.StoreVersion, authority.Put([]byte("later"))).Kind
			})
		}},
		{"CommitChecksReservationFirst", func(t *testing.T, fx *Fixture) {
			r1 := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			ready := fx.MustCommit(r1, []byte("ready"))
			r2 := fx.Reserve(authority.ObjectUserSpot, "s2", TargetA)
			leave(t, fx, StoreVersions, 0)
			before := fx.State()
			res := commit(t, fx, r1.CommitRequest([]byte("ready")))
			require.Equal(t, authority.KindAlreadyCommitted, res.Kind)
			RequireSameRow(t, ready, res.Ready)
			req := r2.CommitRequest([]byte("ready"))
			req.ReservationID = "not-" + req.ReservationID
			require.Equal(t, authority.KindStale, commit(t, fx, req).Kind)
			fx.RequireState(before)
		}},
		{"CompleteCreation", func(t *testing.T, fx *Fixture) {
			needGenerations(t, fx)
			kinds := []authority.CompletionKind{authority.TerminalCreated, authority.TerminalRejected, authority.TerminalFailed}
			var rs []Reservation
			for _, kind := range kinds {
				rs = append(rs, fx.Reserve(authority.ObjectActor, "a-"+string(kind), TargetA))
			}
			leave(t, fx, StoreVersions, 0)
			for i, kind := range kinds {
				r := rs[i]
				pub := fx.Publication()
				exhausted(t, fx, func() authority.ResultKind {
					res := complete(t, fx, r.CompleteRequest(kind, []byte("ready"), pub))
					require.Nil(t, res.Ready)
					require.Nil(t, res.Terminal)
					return res.Kind
				})
				read, err := fx.Store().ReadCreationTerminal(fx.Ctx(), pub.Operation)
				require.NoError(t, err)
				require.Equal(t, authority.KindMissing, read.Kind, "an exhausted completion publishes no terminal")
				RequireSameRow(t, r.Res.Creating, fx.MustRow(r.Key))
			}
		}},
		{"CompleteCreationChecksTerminalsFirst", func(t *testing.T, fx *Fixture) {
			r1 := fx.Reserve(authority.ObjectActor, "a1", TargetA)
			pub := fx.Publication()
			fx.MustComplete(r1, authority.TerminalCreated, []byte("ready"), pub)
			r2 := fx.Reserve(authority.ObjectActor, "a2", TargetA)
			leave(t, fx, StoreVersions, 0)
			before := fx.State()
			again := complete(t, fx, r1.CompleteRequest(authority.TerminalCreated, []byte("ready"), pub))
			require.Equal(t, authority.KindAlreadyCompleted, again.Kind)
			req := r2.CompleteRequest(authority.TerminalFailed, nil, fx.Publication())
			req.ReservationID = "not-" + req.ReservationID
			require.Equal(t, authority.KindStale, complete(t, fx, req).Kind)
			fx.RequireState(before)
		}},
		{"CompareExchange", func(t *testing.T, fx *Fixture) {
			key := fx.Key(authority.ObjectUserSpot, "s1")
			s := fx.Active(authority.ObjectUserSpot, "s1", TargetA)
			lease2 := authority.OwnerToken{OwnerID: OwnerA.OwnerID, LeaseGeneration: 2}
			fx.SetLive(Target(NodeA, NodeLifecycle, lease2), true)
			leave(t, fx, StoreVersions, 0)
			for _, m := range []authority.Mutation{
				authority.Put([]byte("x")),
				authority.Delete(),
				authority.Restore(OwnerA, []byte("x")),
				authority.RebindOwnerLease(OwnerA, lease2, []byte("x")),
			} {
				exhausted(t, fx, func() authority.ResultKind {
					res := cas(t, fx, key, s.StoreVersion, m)
					require.Nil(t, res.Snapshot, "mutation %s", m.Kind)
					return res.Kind
				})
			}
			// The version and owner checks come first.
			res := cas(t, fx, key, "no-such-version", authority.Put(nil))
			require.Equal(t, authority.KindConflict, res.Kind)
			res = cas(t, fx, key, s.StoreVersion, authority.Restore(OwnerB, nil))
			require.Equal(t, authority.KindConflict, res.Kind)
			RequireSameRow(t, s, fx.MustRow(key))
		}},
		{"CommitAggregateNeedsAVersionPerParticipant", func(t *testing.T, fx *Fixture) {
			m := newMove(fx)
			fence := fx.MustPrepare(m.req)
			leave(t, fx, StoreVersions, int64(len(m.req.Participants))-1)
			exhausted(t, fx, func() authority.ResultKind { return commitAggregateKind(t, fx, fence) })
			// Still prepared: a retry of the prepare is answered, an abort
			// releases the target's capacity.
			require.Equal(t, authority.KindAlreadyPrepared, prepareKind(t, fx, m.req))
			require.Equal(t, authority.KindAborted, abortAggregateKind(t, fx, fence))
			fx.RequireUsage(NodeB, authority.ObjectActor, "", 1, 0)
		}},
		{"CommitAggregateTakesLastStoreVersions", func(t *testing.T, fx *Fixture) {
			m := newMove(fx)
			fence := fx.MustPrepare(m.req)
			leave(t, fx, StoreVersions, int64(len(m.req.Participants)))
			require.Equal(t, authority.KindCommitted, commitAggregateKind(t, fx, fence))
			require.Equal(t, OwnerB, fx.MustRow(m.a1Key).Owner())
		}},
		{"CommitAggregateNeedsAnOwnerGenerationPerNewOwner", func(t *testing.T, fx *Fixture) {
			s1 := fx.Active(authority.ObjectUserSpot, "s1", TargetA)
			s2 := fx.Active(authority.ObjectUserSpot, "s2", TargetA)
			capacity := authority.CapacityVector{Spots: 2, SpotType: &authority.SpotTypeCapacity{ObjectKind: authority.ObjectUserSpot, StableType: DefaultStableType, Count: 2}}
			req := AggregateRequest("agg-o", 1, TargetB, capacity,
				Participant(fx.Key(authority.ObjectUserSpot, "s1"), s1.StoreVersion, authority.TransitionNewOwner, nil),
				Participant(fx.Key(authority.ObjectUserSpot, "s2"), s2.StoreVersion, authority.TransitionNewOwner, nil))
			fence := fx.MustPrepare(req)
			leave(t, fx, OwnerGenerations, 1) // two newOwner participants need two
			exhausted(t, fx, func() authority.ResultKind { return commitAggregateKind(t, fx, fence) })
			require.Equal(t, authority.KindAborted, abortAggregateKind(t, fx, fence))
		}},
		{"CommitAggregateTakesLastOwnerGenerations", func(t *testing.T, fx *Fixture) {
			m := newMove(fx)
			fence := fx.MustPrepare(m.req)
			// one newOwner participant; the preserve one takes no owner generation
			leave(t, fx, OwnerGenerations, 1)
			require.Equal(t, authority.KindCommitted, commitAggregateKind(t, fx, fence))
			require.Equal(t, OwnerB, fx.MustRow(m.a1Key).Owner())
		}},
		{"CommitAggregateChecksRecordAndRowsFirst", func(t *testing.T, fx *Fixture) {
			m := newMove(fx)
			fence := fx.MustPrepare(m.req)
			require.Equal(t, authority.KindCommitted, commitAggregateKind(t, fx, fence))
			moved := fx.MustRow(m.a1Key)
			other := AggregateRequest("agg-2", 1, TargetA, authority.CapacityVector{Actors: 1},
				Participant(m.a1Key, moved.StoreVersion, authority.TransitionNewOwner, nil))
			fence2 := fx.MustPrepare(other)
			fx.Put(m.a1Key, moved.StoreVersion, []byte("changed"))
			leave(t, fx, StoreVersions, 0)
			before := fx.State()
			require.Equal(t, authority.KindAlreadyCommitted, commitAggregateKind(t, fx, fence))
			require.Equal(t, authority.KindStale, commitAggregateKind(t, fx, fence2))
			fx.RequireState(before)
		}},
		{"OperationsTakingNoValueStillWork", func(t *testing.T, fx *Fixture) {
			// abort, prepareAggregate, abortAggregate and removeAllByOwner
			// write no new version or generation.
			needGenerations(t, fx)
			m := newMove(fx)
			r := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			for _, c := range []GenerationCounter{StoreVersions, ObjectGenerations, OwnerGenerations} {
				leave(t, fx, c, 0)
			}
			res, err := fx.Store().Abort(fx.Ctx(), r.AbortRequest())
			require.NoError(t, err)
			require.Equal(t, authority.KindAborted, res.Kind)
			fence := fx.MustPrepare(m.req)
			fx.RequireUsage(NodeB, authority.ObjectActor, "", 1, 1)
			require.Equal(t, authority.KindAborted, abortAggregateKind(t, fx, fence))
			fx.RequireUsage(NodeB, authority.ObjectActor, "", 1, 0)
			RequireSameRow(t, m.a1, fx.MustRow(m.a1Key))
			require.Len(t, fx.ListAll(authority.KindPrefix(authority.ObjectActor), 1), 2)
			n, err := fx.Store().RemoveAllByOwner(fx.Ctx(), OwnerA)
			require.NoError(t, err)
			require.Equal(t, int64(1), n)
			fx.RequireMissing(m.a1Key)
			fx.RequireUsage(NodeA, authority.ObjectActor, "", 0, 0)
		}},
	})
}
