package conformance

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
)

// RunTestClockStepBack checks that expiry is monotonic when the store's
// clock steps back (an NTP step): the store's clock never reads earlier
// than an operation already saw, so once an operation ran at a time a
// record had expired by, no later operation sees the record alive, whatever
// the clock does. A step back that no operation saw the far side of changes
// nothing (docs/deviations.md C18).
func RunTestClockStepBack(ctx context.Context, t *testing.T, f Factory) {
	runSubtests(ctx, t, f, []subtest{
		{"TerminalExpiredAtAWriteStaysExpired", testStepBackAfterAWrite},
		{"TerminalReadExpiredStaysExpired", testStepBackAfterARead},
		{"TerminalNobodySawExpiredStaysLive", testStepBackUnseen},
		{"ReservationTerminalStaysExpired", testStepBackReservationTerminal},
		{"AggregateRecordStaysExpired", testStepBackAggregate},
		{"BlobStaysExpired", testStepBackBlob},
	})
}

// completedActor reserves and completes an Actor and returns the
// reservation, the completion's publication and how far the clock must move
// to pass the terminal's expiry by a second.
func completedActor(t *testing.T, fx *Fixture, id string) (Reservation, *authority.TerminalPublication, time.Duration) {
	t.Helper()
	needClock(t, fx)
	r := fx.Reserve(authority.ObjectActor, id, TargetA)
	pub := fx.PublicationFor(fx.Operation(), time.Minute)
	first := fx.MustComplete(r, authority.TerminalCreated, []byte("ready"), pub)
	return r, pub, first.Terminal.ExpiresAt.Sub(fx.H.Now()) + time.Second
}

// completeAgain completes r once more with a new publication of op whose
// expiry is valid at the store's clock, whichever way it stepped.
func completeAgain(t *testing.T, fx *Fixture, r Reservation, op authority.CreationOperation) authority.ResultKind {
	t.Helper()
	res, err := fx.Store().CompleteCreation(fx.Ctx(), r.CompleteRequest(authority.TerminalCreated, []byte("ready"),
		fx.PublicationFor(op, time.Hour)))
	require.NoError(t, err)
	return res.Kind
}

func readTerminal(t *testing.T, fx *Fixture, op authority.CreationOperation) authority.ResultKind {
	t.Helper()
	res, err := fx.Store().ReadCreationTerminal(fx.Ctx(), op)
	require.NoError(t, err)
	return res.Kind
}

// testStepBackAfterAWrite: an unrelated write runs after the terminal's
// expiry, then the clock steps back before it. The write's time stands:
// the terminal stays expired (memory's write-time sweep deleted it; etcd
// showed it again).
func testStepBackAfterAWrite(t *testing.T, fx *Fixture) {
	r, pub, past := completedActor(t, fx, "b")
	fx.H.AdvanceClock(t, past)
	fx.Reserve(authority.ObjectActor, "any-write", TargetA)
	fx.H.AdvanceClock(t, -past-time.Minute) // before the expiry again
	require.Equal(t, authority.KindStale, completeAgain(t, fx, r, pub.Operation),
		"the terminal expired at the write's time: the committed reservation answers")
	require.Equal(t, authority.KindMissing, readTerminal(t, fx, pub.Operation))
	_, err := fx.Store().CompleteCreation(fx.Ctx(), r.CompleteRequest(authority.TerminalCreated, []byte("ready"), pub))
	require.ErrorIs(t, err, authority.ErrInvalidArgument, "the first publication's expiry passed at the store's clock")
}

// testStepBackAfterARead: a read finds the terminal expired, then the clock
// steps back before its expiry. The terminal stays missing (the seed's
// read deletes it; etcd only hid it and showed it again).
func testStepBackAfterARead(t *testing.T, fx *Fixture) {
	r, pub, past := completedActor(t, fx, "c")
	fx.H.AdvanceClock(t, past)
	require.Equal(t, authority.KindMissing, readTerminal(t, fx, pub.Operation))
	fx.H.AdvanceClock(t, -past-time.Minute)
	require.Equal(t, authority.KindStale, completeAgain(t, fx, r, pub.Operation))
	require.Equal(t, authority.KindMissing, readTerminal(t, fx, pub.Operation))
}

// testStepBackUnseen: the clock passes the expiry and steps back with no
// operation in between: nothing saw the terminal expired, so it answers.
func testStepBackUnseen(t *testing.T, fx *Fixture) {
	r, pub, past := completedActor(t, fx, "d")
	fx.H.AdvanceClock(t, past)
	fx.H.AdvanceClock(t, -past-time.Minute)
	res, err := fx.Store().CompleteCreation(fx.Ctx(), r.CompleteRequest(authority.TerminalCreated, []byte("ready"), pub))
	require.NoError(t, err)
	require.Equal(t, authority.KindAlreadyCompleted, res.Kind)
	require.Equal(t, authority.KindFound, readTerminal(t, fx, pub.Operation))
}

// pastRetention skips t without a stated retention and returns how far
// the clock must move to pass it by a second.
func pastRetention(t *testing.T, fx *Fixture) time.Duration {
	t.Helper()
	needClock(t, fx)
	if fx.H.RecordRetention <= 0 {
		t.Skip("provider does not state its record retention")
	}
	return fx.H.RecordRetention + time.Second
}

func testStepBackReservationTerminal(t *testing.T, fx *Fixture) {
	past := pastRetention(t, fx)
	r := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
	fx.MustCommit(r, []byte("ready"))
	commit := func() authority.ResultKind {
		res, err := fx.Store().Commit(fx.Ctx(), r.CommitRequest([]byte("ready")))
		require.NoError(t, err)
		return res.Kind
	}
	fx.H.AdvanceClock(t, past)
	require.Equal(t, authority.KindStale, commit())
	fx.H.AdvanceClock(t, -past)
	require.Equal(t, authority.KindStale, commit(), "the reservation terminal was seen expired")
}

func testStepBackAggregate(t *testing.T, fx *Fixture) {
	past := pastRetention(t, fx)
	m := newMove(fx)
	fence := fx.MustPrepare(m.req)
	require.Equal(t, authority.KindCommitted, commitAggregateKind(t, fx, fence))
	fx.H.AdvanceClock(t, past)
	require.Equal(t, authority.KindStale, commitAggregateKind(t, fx, fence))
	fx.H.AdvanceClock(t, -past)
	require.Equal(t, authority.KindStale, commitAggregateKind(t, fx, fence), "the aggregate record was seen expired")
}

func testStepBackBlob(t *testing.T, fx *Fixture) {
	needClock(t, fx)
	rs := fx.H.Relocation
	if rs == nil {
		t.Skip("provider has no relocation store")
	}
	put, err := rs.PutNew(fx.Ctx(), []byte("envelope"), time.Minute)
	require.NoError(t, err)
	read := func() authority.ResultKind {
		res, err := rs.Read(fx.Ctx(), put.Reference)
		require.NoError(t, err)
		return res.Kind
	}
	fx.H.AdvanceClock(t, 2*time.Minute)
	require.Equal(t, authority.KindMissing, read())
	fx.H.AdvanceClock(t, -2*time.Minute)
	require.Equal(t, authority.KindMissing, read(), "the blob was seen expired")
}
