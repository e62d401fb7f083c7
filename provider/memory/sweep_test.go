package memory

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
)

func TestRetentionSweepsReservationTerminals(t *testing.T) {
	e := newEnv(t, func(o *Config) { o.ReservationRetention = time.Minute })
	req := spotRequest("s1", target(nodeA, ownerA))
	res := e.reserve(req)
	creq := commitRequest(req, res, "ready")
	require.Equal(t, authority.KindCommitted, e.commit(creq).Kind)
	areq := spotRequest("s2", target(nodeA, ownerA))
	ares := e.reserve(areq)
	abort := authority.AbortRequest{Key: areq.Key, ReservationID: ares.ReservationID, ExpectedStoreVersion: ares.Creating.StoreVersion, Target: areq.Target}
	out, err := e.s.Abort(e.ctx, abort)
	require.NoError(t, err)
	require.Equal(t, authority.KindAborted, out.Kind)
	require.Equal(t, 2, e.state().reservations)

	// Within retention the repeats are idempotent.
	e.clock.Advance(time.Minute - time.Nanosecond)
	require.Equal(t, authority.KindAlreadyCommitted, e.commit(creq).Kind)
	out, _ = e.s.Abort(e.ctx, abort)
	require.Equal(t, authority.KindAlreadyAborted, out.Kind)
	require.Equal(t, 2, e.state().reservations)

	// After it, the records are swept by the next write and repeats are stale.
	e.clock.Advance(time.Nanosecond)
	require.Equal(t, authority.KindStale, e.commit(creq).Kind)
	require.Equal(t, 0, e.state().reservations)
	out, _ = e.s.Abort(e.ctx, abort)
	require.Equal(t, authority.KindStale, out.Kind)
}

func TestRetentionBoundsGrowth(t *testing.T) {
	e := newEnv(t, func(o *Config) { o.ReservationRetention = time.Minute })
	// Many create/delete cycles over ten retention periods: the retained
	// records stay bounded by what one retention period produces.
	const perMinute = 300
	peak := 0
	for minute := range 10 {
		for i := range perMinute {
			key, ready := e.spot(fmt.Sprintf("m%d-%d", minute, i))
			require.Equal(t, authority.KindDeleted, e.cas(key, ready.StoreVersion, authority.Delete()).Kind)
		}
		peak = max(peak, e.state().reservations)
		e.clock.Advance(time.Minute)
	}
	require.LessOrEqual(t, peak, 2*perMinute)
	e.spot("last")
	require.Equal(t, 1, e.state().reservations)
	// 3000 reservations, of which one retention period's are kept: the
	// table keeps at most the chunks they span.
	require.LessOrEqual(t, e.chunks(), 2)
	e.s.mu.Lock()
	require.LessOrEqual(t, e.s.reservationSweep.len(), 1)
	require.LessOrEqual(t, cap(e.s.reservationSweep.items), 4*perMinute)
	e.s.mu.Unlock()
}

func TestRetentionSweepsAggregates(t *testing.T) {
	e := newEnv(t, func(o *Config) { o.ReservationRetention = time.Minute })
	k1, s1 := e.spot("s1")
	k2, s2 := e.spot("s2")
	k3, s3 := e.spot("s3")
	committed := moveRequest(1, map[authority.Key]*authority.Snapshot{k1: s1}, nil)
	aborted := moveRequest(2, map[authority.Key]*authority.Snapshot{k2: s2}, nil)
	prepared := moveRequest(3, map[authority.Key]*authority.Snapshot{k3: s3}, nil)
	for _, r := range []authority.AggregatePrepareRequest{committed, aborted, prepared} {
		require.Equal(t, authority.KindPrepared, e.prepare(r))
	}
	require.Equal(t, authority.KindCommitted, e.commitAggregate(committed.Fence()))
	require.Equal(t, authority.KindAborted, e.abortAggregate(aborted.Fence()))

	e.clock.Advance(time.Hour)
	// Prepared aggregates are never swept.
	require.Equal(t, authority.KindAlreadyPrepared, e.prepare(prepared))
	require.Equal(t, 1, e.state().aggregates)
	// The swept ones are forgotten: a repeat is stale.
	require.Equal(t, authority.KindStale, e.commitAggregate(committed.Fence()))
	require.Equal(t, authority.KindStale, e.abortAggregate(aborted.Fence()))
	// Re-preparing the committed fence conflicts (its rows moved on); the
	// aborted one, whose rows did not change, can be prepared again.
	require.Equal(t, authority.KindConflict, e.prepare(committed))
	require.Equal(t, authority.KindPrepared, e.prepare(aborted))
	require.Equal(t, authority.KindCommitted, e.commitAggregate(prepared.Fence()))
}

func TestRetentionSweepsCreationTerminals(t *testing.T) {
	e := newEnv(t)
	for i := range 50 {
		req := actorRequest(fmt.Sprintf("a%d", i), target(nodeA, ownerA))
		res := e.reserve(req)
		// Deadlines out of order: the heap sweeps by expiry, not insertion.
		deadline := testEpoch.Add(time.Duration((i*37)%50+1) * time.Second)
		out, err := e.s.CompleteCreation(e.ctx, authority.CompleteCreationRequest{
			Key: req.Key, ReservationID: res.ReservationID, ExpectedStoreVersion: res.Creating.StoreVersion,
			Target: req.Target, Completion: completion(authority.TerminalFailed, operation(uint64(i+1)), deadline),
		})
		require.NoError(t, err)
		require.Equal(t, authority.KindFailed, out.Kind)
	}
	require.Equal(t, 50, e.state().terminals)
	e.clock.Advance(authority.CreationTerminalRetention + 25*time.Second)
	e.spot("trigger")
	require.Equal(t, 25, e.state().terminals)
	for i := range 50 {
		res, err := e.s.ReadCreationTerminal(e.ctx, operation(uint64(i+1)))
		require.NoError(t, err)
		want := authority.KindMissing
		if (i*37)%50+1 > 25 {
			want = authority.KindFound
		}
		require.Equal(t, want, res.Kind, "operation %d", i+1)
	}
	e.clock.Advance(time.Minute)
	e.spot("trigger2")
	require.Equal(t, 0, e.state().terminals)
	require.Empty(t, e.s.terminalSweep)
}

func TestFIFO(t *testing.T) {
	var q fifo[int]
	for i := range 5000 {
		q.push(i)
	}
	for i := range 4000 {
		require.Equal(t, i, *q.front())
		q.pop()
	}
	require.Equal(t, 1000, q.len())
	require.Less(t, len(q.items), 5000, "compacted")
	for i := 4000; i < 5000; i++ {
		require.Equal(t, i, *q.front())
		q.pop()
	}
	require.Zero(t, q.len())
}
