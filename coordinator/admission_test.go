package coordinator_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/coordinator"
)

// The caller that ran a creation gets its outcome even when its own ctx ends
// right after the creation settled (here: in the ready-route hook, after the
// commit).
func TestCreatorGetsOutcomeAfterItsContextEnds(t *testing.T) {
	for i := range 20 {
		e := newEnv(t, memoryFactory)
		ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
		c, _ := newCoordinator(t, e.h.Store, coordinator.UserSpotOptions{
			PublishReadyRoute: func(string, coordinator.ReadyRoute) { cancel() },
		}, localTarget())
		a := &app{}
		res, err := c.GetOrCreate(ctx, request("spot-1"), a.materialize, a.discard)
		require.NoError(t, err, "run %d", i)
		require.Equal(t, coordinator.Created, res.State)
		require.Equal(t, int64(0), a.discarded.Load())
		requireReadyUserSpot(t, e, "spot-1")
		cancel()
	}
}

// holdWinner holds the reply of the first Reserve (the winner's) until the
// other callers' Reserves returned or hold passed: the window in which a
// loser could look for the winner's admission before it is registered.
type holdWinner struct {
	authority.Store
	others int64
	hold   time.Duration
	calls  atomic.Int64
	done   atomic.Int64
	all    chan struct{}
}

func (s *holdWinner) Reserve(ctx context.Context, req authority.ReserveRequest) (authority.ReserveResult, error) {
	first := s.calls.Add(1) == 1
	r, err := s.Store.Reserve(ctx, req)
	if first {
		t := time.NewTimer(s.hold)
		defer t.Stop()
		select {
		case <-s.all:
		case <-t.C:
		}
		return r, err
	}
	if s.done.Add(1) == s.others {
		close(s.all)
	}
	return r, err
}

// Concurrent local callers that lose the reservation share the winner's
// outcome, a rejection included (the seed's localCreations): none of them
// waits for a Ready row that a rejected creation never writes, even when
// their Reserve returns before the winner's.
func TestLosersShareARejection(t *testing.T) {
	e := newEnv(t, memoryFactory)
	const n = 8
	store := &holdWinner{Store: e.h.Store, others: n - 1, hold: 200 * time.Millisecond, all: make(chan struct{})}
	c, _ := newCoordinator(t, store, coordinator.UserSpotOptions{}, localTarget())
	a := &app{outcome: func(ctx context.Context) (coordinator.Materialized, error) {
		// the losers meet this reservation, not an aborted row
		select {
		case <-store.all:
		case <-ctx.Done():
			return coordinator.Materialized{}, ctx.Err()
		}
		return coordinator.Materialized{State: coordinator.Rejected, Reply: []byte("no")}, nil
	}}
	results := make([]coordinator.CreateResult, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	winnerReserving := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			if i > 0 {
				<-winnerReserving
			}
			req := request("spot-1")
			req.Timeout = 3 * time.Second
			results[i], errs[i] = c.GetOrCreate(e.ctx, req, a.materialize, a.discard)
		})
		if i == 0 {
			for store.calls.Load() == 0 {
				time.Sleep(time.Millisecond)
			}
			close(winnerReserving)
		}
	}
	wg.Wait()
	for i := range n {
		require.NoError(t, errs[i], "caller %d", i)
		require.Equal(t, coordinator.Rejected, results[i].State, "caller %d", i)
		require.Equal(t, []byte("no"), results[i].Reply)
	}
	require.Equal(t, int64(1), a.materialized.Load())
	require.Equal(t, int64(1), a.discarded.Load())
	requireMissing(t, e, authority.ObjectUserSpot, "spot-1")
}

// A materialize that panics: the panic reaches the caller that ran it, the
// reservation is rolled back (row gone, capacity released, discard called),
// and the admission is settled, so a later delivery of the same reservation
// answers at once instead of waiting on it forever.
func TestMaterializePanicRollsBack(t *testing.T) {
	t.Run("local", func(t *testing.T) {
		e := newEnv(t, memoryFactory)
		c, _ := newCoordinator(t, e.h.Store, coordinator.UserSpotOptions{}, localTarget())
		pub := &publication{}
		a := &app{outcome: func(context.Context) (coordinator.Materialized, error) {
			panic("materialize exploded")
		}}
		require.PanicsWithValue(t, "materialize exploded", func() {
			_, _ = c.GetOrCreate(e.ctx, request("spot-1"), a.materialize, a.discard)
		})
		require.Equal(t, int64(1), a.discarded.Load())
		requireMissing(t, e, authority.ObjectUserSpot, "spot-1")
		require.Equal(t, authority.CapacityUsage{}, e.usage(nodeA, authority.ObjectUserSpot, stableType))
		require.Equal(t, int64(0), pub.aborted.Load())

		ok := &app{}
		res, err := c.GetOrCreate(e.ctx, request("spot-1"), ok.materialize, ok.discard)
		require.NoError(t, err)
		require.Equal(t, coordinator.Created, res.State)
	})
	t.Run("publish after commit", func(t *testing.T) {
		// As in the seed, a failure after the commit still rolls back: the
		// abort finds the row committed (stale) and the object is discarded.
		e := newEnv(t, memoryFactory)
		c, _ := newCoordinator(t, e.h.Store, coordinator.UserSpotOptions{
			PublishReadyRoute: func(string, coordinator.ReadyRoute) { panic("hook exploded") },
		}, localTarget())
		pub := &publication{}
		a := &app{outcome: func(context.Context) (coordinator.Materialized, error) {
			return coordinator.Materialized{State: coordinator.Created, Publication: pub}, nil
		}}
		require.PanicsWithValue(t, "hook exploded", func() {
			_, _ = c.GetOrCreate(e.ctx, request("spot-1"), a.materialize, a.discard)
		})
		require.Equal(t, int64(1), pub.aborted.Load())
		require.Equal(t, int64(0), pub.published.Load())
		require.Equal(t, int64(1), a.discarded.Load())
	})
	t.Run("remote delivery", func(t *testing.T) {
		e := newEnv(t, memoryFactory)
		b, _ := newCoordinator(t, e.h.Store, coordinator.UserSpotOptions{})
		var captured atomic.Pointer[coordinator.RemoteCreate]
		a, _ := newCoordinator(t, e.h.Store, coordinator.UserSpotOptions{
			Transport: coordinator.TransportFunc(func(ctx context.Context, _, _ string, req coordinator.RemoteCreate) (coordinator.RemoteReply, error) {
				captured.Store(&req)
				panicking := &app{outcome: func(context.Context) (coordinator.Materialized, error) { panic("remote exploded") }}
				var res coordinator.CreateResult
				var err error
				func() {
					defer func() { _ = recover() }()
					res, err = b.HandleRemoteCreate(ctx, req, panicking.remoteMaterialize, panicking.discard)
				}()
				if err == nil && res.State == "" {
					err = errors.New("remote materialize panicked")
				}
				return res.RemoteReply(), err
			}),
		}, remoteTarget())
		_, err := a.GetOrCreate(e.ctx, request("spot-1"), nil2(), nil)
		require.Error(t, err)
		requireMissing(t, e, authority.ObjectUserSpot, "spot-1")

		// A redelivery of the same reservation is answered, not parked on a
		// never-settled admission.
		ctx, cancel := context.WithTimeout(e.ctx, 5*time.Second)
		defer cancel()
		ok := &app{}
		_, err = b.HandleRemoteCreate(ctx, *captured.Load(), ok.remoteMaterialize, ok.discard)
		requireKind(t, err, coordinator.KindSpotMoving)
		require.Equal(t, int64(0), ok.materialized.Load())
	})
}

// commitUnknown is a store whose Commit reports ErrOutcomeUnknown: apply
// says whether the first commit is applied before that, and unknownAfter
// how many more commits also answer unknown (without reaching the store).
type commitUnknown struct {
	authority.Store
	apply        bool
	unknownAfter int64
	commits      atomic.Int64
}

func (s *commitUnknown) Commit(ctx context.Context, req authority.CommitRequest) (authority.CommitResult, error) {
	n := s.commits.Add(1)
	if n == 1 {
		if s.apply {
			if _, err := s.Store.Commit(ctx, req); err != nil {
				return authority.CommitResult{}, err
			}
		}
		return authority.CommitResult{}, authority.Wrap(authority.ErrOutcomeUnknown, "reply lost", context.DeadlineExceeded)
	}
	if n <= 1+s.unknownAfter {
		return authority.CommitResult{}, authority.Wrap(authority.ErrOutcomeUnknown, "reply lost", nil)
	}
	return s.Store.Commit(ctx, req)
}

// A Ready commit whose outcome is unknown is re-sent before anything is
// rolled back; the object is discarded only when the abort proves the
// reservation aborted.
func TestUnknownCommitOutcome(t *testing.T) {
	cases := []struct {
		name         string
		apply        bool
		unknownAfter int64
		created      bool // the creation succeeds
		discarded    bool
		kept         bool // the error says the object was kept
	}{
		{name: "applied, resend answers", apply: true, created: true},
		{name: "not applied, resend commits", apply: false, created: true},
		{name: "applied, no answer before cleanup timeout", apply: true, unknownAfter: 1 << 40, kept: true},
		{name: "not applied, no answer before cleanup timeout", apply: false, unknownAfter: 1 << 40, discarded: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, memoryFactory)
			store := &commitUnknown{Store: e.h.Store, apply: tc.apply, unknownAfter: tc.unknownAfter}
			c, _ := newCoordinator(t, store, coordinator.UserSpotOptions{CleanupTimeout: 100 * time.Millisecond}, localTarget())
			a := &app{}
			res, err := c.GetOrCreate(e.ctx, request("spot-1"), a.materialize, a.discard)
			require.Greater(t, store.commits.Load(), int64(1), "the commit is re-sent")
			if tc.created {
				require.NoError(t, err)
				require.Equal(t, coordinator.Created, res.State)
				requireReadyUserSpot(t, e, "spot-1")
			} else {
				// the first commit was cut short by a deadline
				requireKind(t, err, coordinator.KindDeadlineExceeded)
				require.ErrorIs(t, err, authority.ErrOutcomeUnknown)
			}
			if tc.discarded {
				require.Equal(t, int64(1), a.discarded.Load())
				requireMissing(t, e, authority.ObjectUserSpot, "spot-1")
			} else {
				require.Equal(t, int64(0), a.discarded.Load(), "a Spot that may be Ready keeps its object")
			}
			if tc.kept {
				var rb *coordinator.RollbackError
				require.ErrorAs(t, err, &rb)
				requireReadyUserSpot(t, e, "spot-1")
			}
		})
	}
}

// afterReserve runs hook(n) after the n-th Reserve applied, before it
// returns.
type afterReserve struct {
	authority.Store
	calls atomic.Int64
	hook  func(n int64)
}

func (s *afterReserve) Reserve(ctx context.Context, req authority.ReserveRequest) (authority.ReserveResult, error) {
	n := s.calls.Add(1)
	r, err := s.Store.Reserve(ctx, req)
	s.hook(n)
	return r, err
}

// A loser whose Reserve met the winner's reservation still finds the
// winner's admission when the winner finished before the loser looked: a
// settled admission stays until no caller is inside the Spot's gate.
func TestLoserFindsASettledAdmission(t *testing.T) {
	e := newEnv(t, memoryFactory)
	loserApplied := make(chan struct{})
	winnerDone := make(chan struct{})
	store := &afterReserve{Store: e.h.Store, hook: func(n int64) {
		if n == 2 {
			close(loserApplied)
			<-winnerDone
		}
	}}
	c, _ := newCoordinator(t, store, coordinator.UserSpotOptions{}, localTarget())
	a := &app{outcome: func(ctx context.Context) (coordinator.Materialized, error) {
		select {
		case <-loserApplied:
		case <-ctx.Done():
			return coordinator.Materialized{}, ctx.Err()
		}
		return coordinator.Materialized{State: coordinator.Rejected, Reply: []byte("no")}, nil
	}}
	req := request("spot-1")
	req.Timeout = 3 * time.Second
	var loser coordinator.CreateResult
	var loserErr error
	var wg sync.WaitGroup
	winner, err := func() (coordinator.CreateResult, error) {
		started := a.started()
		wg.Go(func() {
			<-started
			loser, loserErr = c.GetOrCreate(e.ctx, req, a.materialize, a.discard)
		})
		return c.GetOrCreate(e.ctx, req, a.materialize, a.discard)
	}()
	close(winnerDone)
	wg.Wait()
	require.NoError(t, err)
	require.Equal(t, coordinator.Rejected, winner.State)
	require.NoError(t, loserErr)
	require.Equal(t, coordinator.Rejected, loser.State)
	require.Equal(t, int64(1), a.materialized.Load())
}

// A discard that panics during the rollback is a cleanup failure, not a
// crash of the process (it runs on its own goroutine) and, during a
// creation's panic, does not replace that panic.
func TestDiscardPanicIsACleanupFailure(t *testing.T) {
	e := newEnv(t, memoryFactory)
	c, _ := newCoordinator(t, e.h.Store, coordinator.UserSpotOptions{}, localTarget())
	boom := errors.New("materialize failed")
	failing := func(context.Context, coordinator.Target, *authority.Snapshot) (coordinator.Materialized, error) {
		return coordinator.Materialized{}, boom
	}
	panickingDiscard := func(context.Context) error { panic("discard exploded") }
	_, err := c.GetOrCreate(e.ctx, request("spot-1"), failing, panickingDiscard)
	require.ErrorIs(t, err, boom)
	var rb *coordinator.RollbackError
	require.ErrorAs(t, err, &rb)
	require.ErrorContains(t, err, "discard panicked: discard exploded")
	requireMissing(t, e, authority.ObjectUserSpot, "spot-1")

	panicking := func(context.Context, coordinator.Target, *authority.Snapshot) (coordinator.Materialized, error) {
		panic("materialize exploded")
	}
	require.PanicsWithValue(t, "materialize exploded", func() {
		_, _ = c.GetOrCreate(e.ctx, request("spot-2"), panicking, panickingDiscard)
	})
	requireMissing(t, e, authority.ObjectUserSpot, "spot-2")
}
