package conformance

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
)

// RunTestCompleteCreation checks CompleteCreation: created, rejected, failed,
// alreadyCompleted and the stale cases, in the contract's order of checks (a live
// terminal of the operation first, then the reservation's own terminal, then
// the row).
func RunTestCompleteCreation(ctx context.Context, t *testing.T, f Factory) {
	complete := func(t *testing.T, fx *Fixture, req authority.CompleteCreationRequest) authority.CompleteCreationResult {
		t.Helper()
		res, err := fx.Store().CompleteCreation(fx.Ctx(), req)
		require.NoError(t, err)
		return res
	}
	stale := func(t *testing.T, fx *Fixture, req authority.CompleteCreationRequest) {
		t.Helper()
		before := fx.State()
		res := complete(t, fx, req)
		require.Equal(t, authority.KindStale, res.Kind)
		require.Nil(t, res.Ready)
		fx.RequireState(before)
		read, err := fx.Store().ReadCreationTerminal(fx.Ctx(), req.Completion.Terminal.Operation)
		require.NoError(t, err)
		require.Equal(t, authority.KindMissing, read.Kind, "a stale completion publishes no terminal")
	}
	requireTerminal := func(t *testing.T, r Reservation, pub *authority.TerminalPublication, state authority.TerminalState, got *authority.TerminalRecord) {
		t.Helper()
		require.NotNil(t, got)
		require.Equal(t, state, got.State)
		require.Equal(t, pub.Operation, got.Operation)
		require.Equal(t, r.Res.ReservationID, got.ReservationID)
		require.Equal(t, authority.ObjectActor, got.ObjectKind)
		require.Equal(t, pub.TerminalEnvelope, got.TerminalEnvelope)
		require.Equal(t, pub.TerminalEnvelopeSHA256, got.TerminalEnvelopeSHA256)
		require.True(t, got.ExpiresAt.Equal(pub.OperationDeadline.Add(authority.CreationTerminalRetention)),
			"terminal expires at %v, want deadline %v + 5 min", got.ExpiresAt, pub.OperationDeadline)
	}
	runSubtests(ctx, t, f, []subtest{
		{"Created", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectActor, "a1", TargetA)
			pub := fx.Publication()
			res := fx.MustComplete(r, authority.TerminalCreated, []byte("ready"), pub)
			require.NotNil(t, res.Ready)
			c := r.Res.Creating
			require.Equal(t, []byte("ready"), res.Ready.Payload)
			require.Equal(t, authority.AllocationActive, res.Ready.Allocation.State)
			require.Nil(t, res.Ready.PendingCreation)
			require.NotEqual(t, c.StoreVersion, res.Ready.StoreVersion)
			require.Equal(t, c.ObjectGeneration, res.Ready.ObjectGeneration)
			require.Equal(t, c.AuthorityOwnerGeneration, res.Ready.AuthorityOwnerGeneration)
			require.Equal(t, OwnerA, res.Ready.Owner())
			requireTerminal(t, r, pub, authority.TerminalCreated, res.Terminal)
			require.False(t, res.Terminal.StoreNow.IsZero())
			RequireSameRow(t, res.Ready, fx.MustRow(r.Key))
			fx.RequireUsage(NodeA, authority.ObjectActor, "", 1, 0)
		}},
		{"Rejected", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectActor, "a1", TargetA)
			pub := fx.Publication()
			res := fx.MustComplete(r, authority.TerminalRejected, nil, pub)
			require.Nil(t, res.Ready)
			requireTerminal(t, r, pub, authority.TerminalRejected, res.Terminal)
			fx.RequireMissing(r.Key)
			fx.RequireUsage(NodeA, authority.ObjectActor, "", 0, 0)
		}},
		{"Failed", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectActor, "a1", TargetA)
			pub := fx.Publication()
			res := fx.MustComplete(r, authority.TerminalFailed, nil, pub)
			require.Nil(t, res.Ready)
			requireTerminal(t, r, pub, authority.TerminalFailed, res.Terminal)
			fx.RequireMissing(r.Key)
			fx.RequireUsage(NodeA, authority.ObjectActor, "", 0, 0)
		}},
		{"AlreadyCompletedRetry", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectActor, "a1", TargetA)
			pub := fx.Publication()
			first := fx.MustComplete(r, authority.TerminalCreated, []byte("ready"), pub)
			before := fx.State()
			res := complete(t, fx, r.CompleteRequest(authority.TerminalCreated, []byte("ready"), pub))
			require.Equal(t, authority.KindAlreadyCompleted, res.Kind)
			requireTerminal(t, r, pub, authority.TerminalCreated, res.Terminal)
			require.Equal(t, first.Terminal.ExpiresAt.UnixMilli(), res.Terminal.ExpiresAt.UnixMilli())
			fx.RequireState(before)
		}},
		{"AlreadyCompletedReportsFirstOutcome", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectActor, "a1", TargetA)
			pub := fx.Publication()
			fx.MustComplete(r, authority.TerminalRejected, nil, pub)
			res := complete(t, fx, r.CompleteRequest(authority.TerminalCreated, []byte("ready"), pub))
			require.Equal(t, authority.KindAlreadyCompleted, res.Kind)
			requireTerminal(t, r, pub, authority.TerminalRejected, res.Terminal)
			fx.RequireMissing(r.Key)
		}},
		{"AlreadyCompletedOperationOfOtherReservation", func(t *testing.T, fx *Fixture) {
			r1 := fx.Reserve(authority.ObjectActor, "a1", TargetA)
			pub := fx.Publication()
			fx.MustComplete(r1, authority.TerminalCreated, []byte("ready"), pub)
			r2 := fx.Reserve(authority.ObjectActor, "a2", TargetA)
			before := fx.State()
			res := complete(t, fx, r2.CompleteRequest(authority.TerminalCreated, []byte("ready"), pub))
			require.Equal(t, authority.KindAlreadyCompleted, res.Kind, "a live terminal of the operation answers first")
			requireTerminal(t, r1, pub, authority.TerminalCreated, res.Terminal)
			fx.RequireState(before)
			require.Equal(t, authority.AllocationReserved, fx.MustRow(r2.Key).Allocation.State)
		}},
		{"StaleNewOperationForFinishedReservation", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectActor, "a1", TargetA)
			fx.MustComplete(r, authority.TerminalCreated, []byte("ready"), fx.Publication())
			stale(t, fx, r.CompleteRequest(authority.TerminalCreated, []byte("ready"), fx.Publication()))
		}},
		{"RetryAfterKeyRecreatedAnswersFirstTerminal", func(t *testing.T, fx *Fixture) {
			// The live terminal of the operation answers first, whatever
			// happened to the row since; the new reservation is untouched.
			r1 := fx.Reserve(authority.ObjectActor, "a1", TargetA)
			pub := fx.Publication()
			first := fx.MustComplete(r1, authority.TerminalCreated, []byte("ready"), pub)
			fx.Delete(r1.Key, first.Ready.StoreVersion)
			r2 := fx.Reserve(authority.ObjectActor, "a1", TargetA)
			before := fx.State()
			res := complete(t, fx, r1.CompleteRequest(authority.TerminalCreated, []byte("ready"), pub))
			require.Equal(t, authority.KindAlreadyCompleted, res.Kind)
			require.Nil(t, res.Ready)
			requireTerminal(t, r1, pub, authority.TerminalCreated, res.Terminal)
			fx.RequireState(before)
			RequireSameRow(t, r2.Res.Creating, fx.MustRow(r2.Key))
		}},
		{"StaleNewOperationAfterKeyRecreated", func(t *testing.T, fx *Fixture) {
			// A finished reservation with a terminal of no live operation is
			// stale, even when its key holds a new reservation.
			r1 := fx.Reserve(authority.ObjectActor, "a1", TargetA)
			fx.MustComplete(r1, authority.TerminalRejected, nil, fx.Publication())
			r2 := fx.Reserve(authority.ObjectActor, "a1", TargetA)
			stale(t, fx, r1.CompleteRequest(authority.TerminalCreated, []byte("ready"), fx.Publication()))
			RequireSameRow(t, r2.Res.Creating, fx.MustRow(r2.Key))
			fx.MustComplete(r2, authority.TerminalCreated, []byte("ready-2"), fx.Publication())
		}},
		{"StaleMissingRow", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectActor, "a1", TargetA)
			req := r.CompleteRequest(authority.TerminalCreated, []byte("ready"), fx.Publication())
			req.Key.GlobalID = "other"
			stale(t, fx, req)
		}},
		{"StaleWrongReservationID", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectActor, "a1", TargetA)
			req := r.CompleteRequest(authority.TerminalCreated, []byte("ready"), fx.Publication())
			req.ReservationID = "not-" + req.ReservationID
			stale(t, fx, req)
		}},
		{"StaleWrongVersion", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectActor, "a1", TargetA)
			other := fx.Reserve(authority.ObjectActor, "a2", TargetA)
			req := r.CompleteRequest(authority.TerminalFailed, nil, fx.Publication())
			req.ExpectedStoreVersion = other.Res.Creating.StoreVersion
			stale(t, fx, req)
		}},
		{"StaleWrongTarget", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectActor, "a1", TargetA)
			req := r.CompleteRequest(authority.TerminalCreated, []byte("ready"), fx.Publication())
			req.Target = TargetB
			stale(t, fx, req)
		}},
		{"StaleWrongTargetNode", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectActor, "a1", TargetA)
			for _, target := range fx.TargetsElsewhere(TargetA) {
				req := r.CompleteRequest(authority.TerminalCreated, []byte("ready"), fx.Publication())
				req.Target = target
				stale(t, fx, req)
			}
			fx.MustComplete(r, authority.TerminalCreated, []byte("ready"), fx.Publication())
		}},
		{"StaleTargetNotLive", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectActor, "a1", TargetA)
			fx.SetLive(TargetA, false)
			stale(t, fx, r.CompleteRequest(authority.TerminalRejected, nil, fx.Publication()))
		}},
		{"StaleAfterAbort", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectActor, "a1", TargetA)
			res, err := fx.Store().Abort(fx.Ctx(), r.AbortRequest())
			require.NoError(t, err)
			require.Equal(t, authority.KindAborted, res.Kind)
			stale(t, fx, r.CompleteRequest(authority.TerminalCreated, []byte("ready"), fx.Publication()))
		}},
		{"OperationReusableAfterTerminalExpiry", func(t *testing.T, fx *Fixture) {
			needClock(t, fx)
			r1 := fx.Reserve(authority.ObjectActor, "a1", TargetA)
			op := fx.Operation()
			fx.MustComplete(r1, authority.TerminalFailed, nil, fx.PublicationFor(op, time.Minute))
			fx.H.AdvanceClock(t, time.Minute+authority.CreationTerminalRetention+time.Second)
			r2 := fx.Reserve(authority.ObjectActor, "a2", TargetA)
			pub := fx.PublicationFor(op, time.Minute)
			res := fx.MustComplete(r2, authority.TerminalCreated, []byte("ready"), pub)
			requireTerminal(t, r2, pub, authority.TerminalCreated, res.Terminal)
		}},
		{"AlreadyCompletedJustBeforeTerminalExpiry", func(t *testing.T, fx *Fixture) {
			// An existing terminal answers while expiresAt > now.
			needClock(t, fx)
			r1 := fx.Reserve(authority.ObjectActor, "a1", TargetA)
			op := fx.Operation()
			pub1 := fx.PublicationFor(op, time.Minute)
			first := fx.MustComplete(r1, authority.TerminalCreated, []byte("ready"), pub1)
			r2 := fx.Reserve(authority.ObjectActor, "a2", TargetA)
			fx.H.AdvanceClock(t, first.Terminal.ExpiresAt.Sub(fx.H.Now())-time.Millisecond)
			before := fx.State()
			res := complete(t, fx, r2.CompleteRequest(authority.TerminalCreated, []byte("ready"), fx.PublicationFor(op, time.Minute)))
			require.Equal(t, authority.KindAlreadyCompleted, res.Kind)
			requireTerminal(t, r1, pub1, authority.TerminalCreated, res.Terminal)
			res = complete(t, fx, r1.CompleteRequest(authority.TerminalCreated, []byte("ready"), pub1))
			require.Equal(t, authority.KindAlreadyCompleted, res.Kind, "the first publication is still valid 1 ms before its expiry")
			fx.RequireState(before)
		}},
		{"OperationReusableAtTerminalExpiry", func(t *testing.T, fx *Fixture) {
			// A terminal whose expiresAt <= now is gone for
			// completeCreation (creationTerminalAvailable), so at exactly
			// its expiry the operation completes another reservation.
			needClock(t, fx)
			r1 := fx.Reserve(authority.ObjectActor, "a1", TargetA)
			op := fx.Operation()
			first := fx.MustComplete(r1, authority.TerminalFailed, nil, fx.PublicationFor(op, time.Minute))
			r2 := fx.Reserve(authority.ObjectActor, "a2", TargetA)
			fx.H.AdvanceClock(t, first.Terminal.ExpiresAt.Sub(fx.H.Now()))
			pub := fx.PublicationFor(op, time.Minute)
			res := fx.MustComplete(r2, authority.TerminalCreated, []byte("ready"), pub)
			requireTerminal(t, r2, pub, authority.TerminalCreated, res.Terminal)
			read, err := fx.Store().ReadCreationTerminal(fx.Ctx(), op)
			require.NoError(t, err)
			require.Equal(t, authority.KindFound, read.Kind)
			require.Equal(t, r2.Res.ReservationID, read.Record.ReservationID)
		}},
		{"PublicationValidUntilItsExpiry", func(t *testing.T, fx *Fixture) {
			// The publication is refused only when expiresAt <= now.
			needClock(t, fx)
			r := fx.Reserve(authority.ObjectActor, "a1", TargetA)
			pub := fx.Publication()
			expiresAt := pub.OperationDeadline.Add(authority.CreationTerminalRetention)
			fx.H.AdvanceClock(t, expiresAt.Sub(fx.H.Now())-time.Millisecond)
			res := fx.MustComplete(r, authority.TerminalCreated, []byte("ready"), pub)
			requireTerminal(t, r, pub, authority.TerminalCreated, res.Terminal)
			read, err := fx.Store().ReadCreationTerminal(fx.Ctx(), pub.Operation)
			require.NoError(t, err)
			require.Equal(t, authority.KindFound, read.Kind)
		}},
		{"PublicationInvalidAtItsExpiry", func(t *testing.T, fx *Fixture) {
			// A terminal with expiresAt <= store now is invalid input, checked before any state (so also for a retry).
			needClock(t, fx)
			r := fx.Reserve(authority.ObjectActor, "a1", TargetA)
			pub := fx.Publication()
			r1 := fx.Reserve(authority.ObjectActor, "a2", TargetA)
			pub1 := fx.PublicationFor(fx.Operation(), time.Minute)
			fx.MustComplete(r1, authority.TerminalCreated, []byte("ready"), pub1)
			fx.H.AdvanceClock(t, pub.OperationDeadline.Add(authority.CreationTerminalRetention).Sub(fx.H.Now()))
			before := fx.State()
			for _, req := range []authority.CompleteCreationRequest{
				r.CompleteRequest(authority.TerminalCreated, []byte("ready"), pub),
				r1.CompleteRequest(authority.TerminalCreated, []byte("ready"), pub1),
			} {
				_, err := fx.Store().CompleteCreation(fx.Ctx(), req)
				require.ErrorIs(t, err, authority.ErrInvalidArgument)
				require.Contains(t, err.Error(), "Creation terminal expiry must be the live operation deadline plus five minutes.")
			}
			fx.RequireState(before)
			read, err := fx.Store().ReadCreationTerminal(fx.Ctx(), pub.Operation)
			require.NoError(t, err)
			require.Equal(t, authority.KindMissing, read.Kind)
			// A publication with a later deadline completes the reservation.
			fx.MustComplete(r, authority.TerminalRejected, nil, fx.Publication())
		}},
		{"CreatedRowBlocksReserve", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectActor, "a1", TargetA)
			fx.MustComplete(r, authority.TerminalCreated, []byte("ready"), fx.Publication())
			res, err := fx.Store().Reserve(fx.Ctx(), fx.ReserveRequest(authority.ObjectActor, "a1", TargetA))
			require.NoError(t, err)
			require.Equal(t, authority.KindAlreadyExists, res.Kind)
		}},
		{"RejectedKeyCanBeReservedAgain", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectActor, "a1", TargetA)
			fx.MustComplete(r, authority.TerminalRejected, nil, fx.Publication())
			r2 := fx.Reserve(authority.ObjectActor, "a1", TargetA)
			require.Greater(t, r2.Res.Creating.ObjectGeneration, r.Res.Creating.ObjectGeneration)
		}},
	})
}
