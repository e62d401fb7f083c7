package coordinator_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/coordinator"
)

// reserveUnknown is a store whose Reserve applies and then reports
// ErrOutcomeUnknown (the reply was lost).
type reserveUnknown struct{ authority.Store }

func (s reserveUnknown) Reserve(ctx context.Context, req authority.ReserveRequest) (authority.ReserveResult, error) {
	if _, err := s.Store.Reserve(ctx, req); err != nil {
		return authority.ReserveResult{}, err
	}
	return authority.ReserveResult{}, authority.Wrap(authority.ErrOutcomeUnknown, "reply lost", nil)
}

// An Instance reservation whose outcome is unknown keeps its recovery
// envelope: the row may be reserved and publish it.
func TestInstanceReserveUnknownOutcomeKeepsEnvelope(t *testing.T) {
	e := newInstanceEnv(t, memoryFactory)
	e.store = reserveUnknown{e.h.Store}
	a := e.authority(t)
	_, err := a.Reserve(e.ctx, activation("inst-1"))
	require.ErrorIs(t, err, authority.ErrOutcomeUnknown)
	requireKind(t, err, coordinator.KindRequestFailed)
	require.Equal(t, 1, e.blobs.liveCount(), "the envelope is kept")
	s, _ := e.instancePayload(t, "inst-1")
	require.NotNil(t, s.PendingCreation)
	require.True(t, e.blobFound(t, s.PendingCreation.RequestContentReference), "the reserved row's envelope is readable")
}

// failingReads is a relocation store whose reads fail with err.
type failingReads struct {
	authority.RelocationStore
	err error
}

func (f failingReads) Read(context.Context, authority.BlobReference) (authority.BlobReadResult, error) {
	return authority.BlobReadResult{}, f.err
}

// A receipt that could not be read back is a failed (or timed-out) read, not
// an integrity failure; the blob is deleted and nothing is reserved.
func TestInstanceReceiptReadFailure(t *testing.T) {
	for _, tc := range []struct {
		err  error
		kind coordinator.ErrorKind
	}{
		{authority.Wrap(authority.ErrUnavailable, "relocation store down", nil), coordinator.KindRequestFailed},
		{context.DeadlineExceeded, coordinator.KindDeadlineExceeded},
	} {
		t.Run(string(tc.kind), func(t *testing.T) {
			e := newInstanceEnv(t, memoryFactory)
			a := e.authority(t, func(o *coordinator.InstanceOptions) { o.Relocation = failingReads{e.blobs, tc.err} })
			_, err := a.Reserve(e.ctx, activation("inst-1"))
			ce := requireKind(t, err, tc.kind)
			require.ErrorIs(t, err, tc.err)
			require.Contains(t, ce.Message, "Relocation Store read")
			require.Equal(t, 0, e.blobs.liveCount())
			requireMissing(t, e.env, authority.ObjectInstanceSpot, "inst-1")
		})
	}
}

// Deadline errors name the operation that ran out of time.
func TestDeadlineMessagesNameTheOperation(t *testing.T) {
	e := newInstanceEnv(t, memoryFactory)
	a := e.authority(t)
	ctx, cancel := context.WithDeadline(e.ctx, time.Now().Add(-time.Second))
	defer cancel()
	_, err := a.Read(ctx, instanceTarget("inst-1"))
	ce := requireKind(t, err, coordinator.KindDeadlineExceeded)
	require.True(t, ce.Retryable)
	require.Equal(t, "Instance authority read exceeded its deadline.", ce.Message)

	// A concurrent activation that does not become Ready in time.
	first, err := a.Reserve(e.ctx, activation("inst-2"))
	require.NoError(t, err)
	act := activation("inst-2")
	act.Deadline = time.Now().Add(50 * time.Millisecond)
	_, err = a.Reserve(e.ctx, act)
	ce = requireKind(t, err, coordinator.KindDeadlineExceeded)
	require.Contains(t, ce.Message, "Instance activation")
	require.NoError(t, a.Abort(e.ctx, instanceTarget("inst-2"), first.Reservation))

	c, _ := newCoordinator(t, e.h.Store, coordinator.UserSpotOptions{}, localTarget())
	app := &app{outcome: func(ctx context.Context) (coordinator.Materialized, error) {
		<-ctx.Done()
		return coordinator.Materialized{}, ctx.Err()
	}}
	req := request("spot-1")
	req.Timeout = 50 * time.Millisecond
	_, err = c.GetOrCreate(e.ctx, req, app.materialize, app.discard)
	ce = requireKind(t, err, coordinator.KindDeadlineExceeded)
	require.True(t, strings.HasPrefix(ce.Message, "User Spot creation"), ce.Message)
	require.False(t, errors.Is(err, coordinator.KindRequestFailed))
}
