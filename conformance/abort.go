package conformance

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
)

// RunTestAbort checks Abort: aborted, alreadyAborted, the stale cases, and
// that an abort releases the reserved capacity.
func RunTestAbort(ctx context.Context, t *testing.T, f Factory) {
	abort := func(t *testing.T, fx *Fixture, req authority.AbortRequest) authority.ResultKind {
		t.Helper()
		res, err := fx.Store().Abort(fx.Ctx(), req)
		require.NoError(t, err)
		return res.Kind
	}
	stale := func(t *testing.T, fx *Fixture, req authority.AbortRequest) {
		t.Helper()
		before := fx.State()
		require.Equal(t, authority.KindStale, abort(t, fx, req))
		fx.RequireState(before)
	}
	runSubtests(ctx, t, f, []subtest{
		{"Aborted", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			fx.RequireUsage(NodeA, authority.ObjectUserSpot, DefaultStableType, 0, 1)
			require.Equal(t, authority.KindAborted, abort(t, fx, r.AbortRequest()))
			fx.RequireMissing(r.Key)
			fx.RequireUsage(NodeA, authority.ObjectUserSpot, DefaultStableType, 0, 0)
			fx.RequireUsage(NodeA, authority.CounterSpots, "", 0, 0)
		}},
		{"AbortsActorReservation", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectActor, "a1", TargetA)
			require.Equal(t, authority.KindAborted, abort(t, fx, r.AbortRequest()))
			fx.RequireMissing(r.Key)
			fx.RequireUsage(NodeA, authority.ObjectActor, "", 0, 0)
		}},
		{"AlreadyAborted", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			require.Equal(t, authority.KindAborted, abort(t, fx, r.AbortRequest()))
			before := fx.State()
			require.Equal(t, authority.KindAlreadyAborted, abort(t, fx, r.AbortRequest()))
			fx.RequireState(before)
		}},
		{"AlreadyAbortedAfterReReserve", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			require.Equal(t, authority.KindAborted, abort(t, fx, r.AbortRequest()))
			r2 := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			require.Equal(t, authority.KindAlreadyAborted, abort(t, fx, r.AbortRequest()))
			RequireSameRow(t, r2.Res.Creating, fx.MustRow(r.Key))
		}},
		{"AbortedWithDeadTarget", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			fx.SetLive(TargetA, false)
			require.Equal(t, authority.KindAborted, abort(t, fx, r.AbortRequest()), "abort needs no live target")
			fx.RequireMissing(r.Key)
		}},
		{"StaleMissingRow", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			req := r.AbortRequest()
			req.Key.GlobalID = "other"
			stale(t, fx, req)
		}},
		{"StaleWrongReservationID", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			req := r.AbortRequest()
			req.ReservationID = "not-" + req.ReservationID
			stale(t, fx, req)
		}},
		{"StaleWrongVersion", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			other := fx.Reserve(authority.ObjectUserSpot, "s2", TargetA)
			req := r.AbortRequest()
			req.ExpectedStoreVersion = other.Res.Creating.StoreVersion
			stale(t, fx, req)
		}},
		{"StaleWrongTarget", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			req := r.AbortRequest()
			req.Target.Owner.LeaseGeneration++
			stale(t, fx, req)
		}},
		{"StaleWrongTargetNode", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			for _, target := range fx.TargetsElsewhere(TargetA) {
				req := r.AbortRequest()
				req.Target = target
				stale(t, fx, req)
			}
			require.Equal(t, authority.KindAborted, abort(t, fx, r.AbortRequest()))
		}},
		{"StaleAfterCommit", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			fx.MustCommit(r, []byte("ready"))
			stale(t, fx, r.AbortRequest())
		}},
		{"StaleAfterCompletion", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectActor, "a1", TargetA)
			fx.MustComplete(r, authority.TerminalRejected, nil, fx.Publication())
			stale(t, fx, r.AbortRequest())
		}},
		{"StaleAfterCommitAndKeyRecreated", func(t *testing.T, fx *Fixture) {
			// The old reservation's abort must not release the new one.
			r1 := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			ready := fx.MustCommit(r1, []byte("ready"))
			fx.Delete(r1.Key, ready.StoreVersion)
			r2 := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			stale(t, fx, r1.AbortRequest())
			RequireSameRow(t, r2.Res.Creating, fx.MustRow(r2.Key))
		}},
		{"StaleAfterRejectionAndKeyRecreated", func(t *testing.T, fx *Fixture) {
			r1 := fx.Reserve(authority.ObjectActor, "a1", TargetA)
			fx.MustComplete(r1, authority.TerminalRejected, nil, fx.Publication())
			r2 := fx.Reserve(authority.ObjectActor, "a1", TargetA)
			stale(t, fx, r1.AbortRequest())
			RequireSameRow(t, r2.Res.Creating, fx.MustRow(r2.Key))
		}},
	})
}
