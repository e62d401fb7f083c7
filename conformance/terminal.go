package conformance

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
)

// RunTestCreationTerminal checks ReadCreationTerminal: read-back of every
// terminal state, isolation of operations, copies, and expiry at the
// operation deadline plus five minutes.
func RunTestCreationTerminal(ctx context.Context, t *testing.T, f Factory) {
	read := func(t *testing.T, fx *Fixture, op authority.CreationOperation) authority.TerminalReadResult {
		t.Helper()
		res, err := fx.Store().ReadCreationTerminal(fx.Ctx(), op)
		require.NoError(t, err)
		return res
	}
	requireFound := func(t *testing.T, fx *Fixture, want *authority.TerminalRecord) {
		t.Helper()
		res := read(t, fx, want.Operation)
		require.Equal(t, authority.KindFound, res.Kind)
		require.NotNil(t, res.Record)
		require.Equal(t, want.State, res.Record.State)
		require.Equal(t, want.Operation, res.Record.Operation)
		require.Equal(t, want.ReservationID, res.Record.ReservationID)
		require.Equal(t, want.ObjectKind, res.Record.ObjectKind)
		require.Equal(t, want.TerminalEnvelope, res.Record.TerminalEnvelope)
		require.Equal(t, want.TerminalEnvelopeSHA256, res.Record.TerminalEnvelopeSHA256)
		require.True(t, want.ExpiresAt.Equal(res.Record.ExpiresAt), "expiry %v, want %v", res.Record.ExpiresAt, want.ExpiresAt)
	}
	readBack := func(state authority.TerminalState) func(t *testing.T, fx *Fixture) {
		return func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectActor, "a1", TargetA)
			res := fx.MustComplete(r, state, []byte("ready"), fx.Publication())
			requireFound(t, fx, res.Terminal)
		}
	}
	runSubtests(ctx, t, f, []subtest{
		{"MissingUnknownOperation", func(t *testing.T, fx *Fixture) {
			res := read(t, fx, fx.Operation())
			require.Equal(t, authority.KindMissing, res.Kind)
			require.Nil(t, res.Record)
			require.False(t, res.StoreNow.IsZero())
		}},
		{"ReadBackCreated", readBack(authority.TerminalCreated)},
		{"ReadBackRejected", readBack(authority.TerminalRejected)},
		{"ReadBackFailed", readBack(authority.TerminalFailed)},
		{"OperationsAreDistinct", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectActor, "a1", TargetA)
			pub := fx.Publication()
			res := fx.MustComplete(r, authority.TerminalCreated, []byte("ready"), pub)
			requireFound(t, fx, res.Terminal)
			for _, mod := range []func(*authority.CreationOperation){
				func(op *authority.CreationOperation) { op.OperationID.Low++ },
				func(op *authority.CreationOperation) { op.OperationID.High++ },
				func(op *authority.CreationOperation) { op.SourceNodeGeneration++ },
				func(op *authority.CreationOperation) { op.SourceNodeRID += "x" },
				func(op *authority.CreationOperation) { op.SourceNodeRID += "/1" },
			} {
				op := pub.Operation
				mod(&op)
				require.Equal(t, authority.KindMissing, read(t, fx, op).Kind, "operation %+v", op)
			}
		}},
		{"SurvivesRowDeletion", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectActor, "a1", TargetA)
			res := fx.MustComplete(r, authority.TerminalCreated, []byte("ready"), fx.Publication())
			fx.Delete(r.Key, res.Ready.StoreVersion)
			requireFound(t, fx, res.Terminal)
		}},
		{"ReturnsCopies", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectActor, "a1", TargetA)
			res := fx.MustComplete(r, authority.TerminalCreated, []byte("ready"), fx.Publication())
			want := res.Terminal.Clone()
			res.Terminal.TerminalEnvelope[0] ^= 0xff
			got := read(t, fx, want.Operation)
			got.Record.TerminalEnvelope[1] ^= 0xff
			requireFound(t, fx, want)
		}},
		{"FoundUntilExpiry", func(t *testing.T, fx *Fixture) {
			needClock(t, fx)
			r := fx.Reserve(authority.ObjectActor, "a1", TargetA)
			res := fx.MustComplete(r, authority.TerminalCreated, []byte("ready"), fx.Publication())
			untilExpiry := res.Terminal.ExpiresAt.Sub(fx.H.Now())
			require.Greater(t, untilExpiry, authority.CreationTerminalRetention)
			fx.H.AdvanceClock(t, untilExpiry-time.Millisecond)
			requireFound(t, fx, res.Terminal)
		}},
		{"MissingAtExpiry", func(t *testing.T, fx *Fixture) {
			needClock(t, fx)
			r := fx.Reserve(authority.ObjectActor, "a1", TargetA)
			res := fx.MustComplete(r, authority.TerminalRejected, nil, fx.Publication())
			fx.H.AdvanceClock(t, res.Terminal.ExpiresAt.Sub(fx.H.Now()))
			require.Equal(t, authority.KindMissing, read(t, fx, res.Terminal.Operation).Kind, "a terminal expires at deadline + 5 min")
		}},
		{"MissingAfterExpiry", func(t *testing.T, fx *Fixture) {
			needClock(t, fx)
			r := fx.Reserve(authority.ObjectActor, "a1", TargetA)
			res := fx.MustComplete(r, authority.TerminalFailed, nil, fx.Publication())
			fx.H.AdvanceClock(t, time.Hour)
			require.Equal(t, authority.KindMissing, read(t, fx, res.Terminal.Operation).Kind)
			require.Equal(t, authority.KindMissing, read(t, fx, res.Terminal.Operation).Kind)
		}},
	})
}
