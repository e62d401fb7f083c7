package conformance

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
)

// RunTestRetention checks how long finished records answer retries: a
// committed or aborted reservation, and a committed or aborted aggregate,
// answer already* until Harness.RecordRetention has passed and are then
// gone (docs/deviations.md M7, E2); a prepared
// aggregate never expires.
func RunTestRetention(ctx context.Context, t *testing.T, f Factory) {
	// around calls before just before the retention of a record written now
	// ends and after just after it.
	around := func(t *testing.T, fx *Fixture, before, after func()) {
		t.Helper()
		needClock(t, fx)
		if fx.H.RecordRetention <= 0 {
			t.Skip("provider does not state its record retention")
		}
		fx.H.AdvanceClock(t, fx.H.RecordRetention-time.Second)
		before()
		fx.H.AdvanceClock(t, 2*time.Second)
		after()
	}
	runSubtests(ctx, t, f, []subtest{
		{"CommittedReservation", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			fx.MustCommit(r, []byte("ready"))
			commit := func() authority.ResultKind {
				res, err := fx.Store().Commit(fx.Ctx(), r.CommitRequest([]byte("ready")))
				require.NoError(t, err)
				return res.Kind
			}
			around(t, fx, func() {
				require.Equal(t, authority.KindAlreadyCommitted, commit())
			}, func() {
				require.Equal(t, authority.KindStale, commit())
				require.Equal(t, authority.AllocationActive, fx.MustRow(r.Key).Allocation.State, "the row stays")
			})
		}},
		{"AbortedReservation", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			res, err := fx.Store().Abort(fx.Ctx(), r.AbortRequest())
			require.NoError(t, err)
			require.Equal(t, authority.KindAborted, res.Kind)
			abort := func() authority.ResultKind {
				res, err := fx.Store().Abort(fx.Ctx(), r.AbortRequest())
				require.NoError(t, err)
				return res.Kind
			}
			around(t, fx, func() {
				require.Equal(t, authority.KindAlreadyAborted, abort())
			}, func() {
				require.Equal(t, authority.KindStale, abort())
			})
		}},
		{"CommittedAggregate", func(t *testing.T, fx *Fixture) {
			m := newMove(fx)
			fence := fx.MustPrepare(m.req)
			require.Equal(t, authority.KindCommitted, commitAggregateKind(t, fx, fence))
			around(t, fx, func() {
				require.Equal(t, authority.KindAlreadyCommitted, commitAggregateKind(t, fx, fence))
				require.Equal(t, authority.KindStale, prepareKind(t, fx, m.req))
			}, func() {
				require.Equal(t, authority.KindStale, commitAggregateKind(t, fx, fence))
				// its participants have moved on: a new prepare conflicts
				require.Equal(t, authority.KindConflict, prepareKind(t, fx, m.req))
				require.Equal(t, []byte("a1-moved"), fx.MustRow(m.a1Key).Payload)
			})
		}},
		{"AbortedAggregate", func(t *testing.T, fx *Fixture) {
			m := newMove(fx)
			fence := fx.MustPrepare(m.req)
			require.Equal(t, authority.KindAborted, abortAggregateKind(t, fx, fence))
			around(t, fx, func() {
				require.Equal(t, authority.KindAlreadyAborted, abortAggregateKind(t, fx, fence))
				require.Equal(t, authority.KindConflict, prepareKind(t, fx, m.req))
			}, func() {
				require.Equal(t, authority.KindStale, abortAggregateKind(t, fx, fence))
				// nothing moved: the fence can be prepared again
				require.Equal(t, authority.KindPrepared, prepareKind(t, fx, m.req))
				require.Equal(t, authority.KindCommitted, commitAggregateKind(t, fx, fence))
			})
		}},
		{"PreparedAggregateNeverExpires", func(t *testing.T, fx *Fixture) {
			m := newMove(fx)
			fence := fx.MustPrepare(m.req)
			around(t, fx, func() {}, func() {
				fx.H.AdvanceClock(t, 10*fx.H.RecordRetention)
				require.Equal(t, authority.KindAlreadyPrepared, prepareKind(t, fx, m.req))
				require.Equal(t, authority.KindCommitted, commitAggregateKind(t, fx, fence))
			})
		}},
	})
}
