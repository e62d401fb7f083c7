package conformance

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
)

// RunTestCommit checks Commit: committed, alreadyCommitted and every stale
// case, and that a stale commit changes nothing.
func RunTestCommit(ctx context.Context, t *testing.T, f Factory) {
	stale := func(t *testing.T, fx *Fixture, req authority.CommitRequest) {
		t.Helper()
		before := fx.State()
		res, err := fx.Store().Commit(fx.Ctx(), req)
		require.NoError(t, err)
		require.Equal(t, authority.KindStale, res.Kind)
		require.Nil(t, res.Ready)
		fx.RequireState(before)
	}
	// alreadyCommitted commits r again and requires alreadyCommitted with
	// want as the row reported, and no write.
	alreadyCommitted := func(t *testing.T, fx *Fixture, r Reservation, want *authority.Snapshot) *authority.Snapshot {
		t.Helper()
		before := fx.State()
		res, err := fx.Store().Commit(fx.Ctx(), r.CommitRequest([]byte("ready")))
		require.NoError(t, err)
		require.Equal(t, authority.KindAlreadyCommitted, res.Kind)
		RequireSameRow(t, want, res.Ready)
		fx.RequireState(before)
		return res.Ready
	}
	runSubtests(ctx, t, f, []subtest{
		{"Committed", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			c := r.Res.Creating
			ready := fx.MustCommit(r, []byte("ready"))
			require.Equal(t, []byte("ready"), ready.Payload)
			require.Equal(t, authority.AllocationActive, ready.Allocation.State)
			require.Nil(t, ready.PendingCreation)
			require.NotEqual(t, c.StoreVersion, ready.StoreVersion)
			require.Equal(t, c.ObjectGeneration, ready.ObjectGeneration)
			require.Equal(t, c.AuthorityOwnerGeneration, ready.AuthorityOwnerGeneration, "commit is no owner transition")
			require.Equal(t, c.Owner(), ready.Owner())
			require.Equal(t, c.Allocation.Descriptor, ready.Allocation.Descriptor)
			require.True(t, c.Allocation.Capacity.Equal(ready.Allocation.Capacity))
			RequireSameRow(t, ready, fx.MustRow(r.Key))
			fx.RequireUsage(NodeA, authority.ObjectUserSpot, DefaultStableType, 1, 0)
		}},
		{"AlreadyCommitted", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			ready := fx.MustCommit(r, []byte("ready"))
			alreadyCommitted(t, fx, r, ready)
		}},
		{"AlreadyCommittedReportsCurrentRow", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			ready := fx.MustCommit(r, []byte("ready"))
			put := fx.Put(r.Key, ready.StoreVersion, []byte("later"))
			alreadyCommitted(t, fx, r, put)
		}},
		{"AlreadyCommittedAfterMove", func(t *testing.T, fx *Fixture) {
			// A committed reservation whose row is active answers
			// alreadyCommitted with the row as it is now, even after an
			// aggregate moved it to another node and owner.
			r := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			ready := fx.MustCommit(r, []byte("ready"))
			req := AggregateRequest("agg-s", 1, TargetB, Capacity(authority.ObjectUserSpot, DefaultStableType),
				Participant(r.Key, ready.StoreVersion, authority.TransitionNewOwner, []byte("moved")))
			require.Equal(t, authority.KindCommitted, commitAggregateKind(t, fx, fx.MustPrepare(req)))
			moved := fx.MustRow(r.Key)
			require.Equal(t, OwnerB, moved.Owner())
			alreadyCommitted(t, fx, r, moved)
		}},
		{"AlreadyCommittedWithDeadOwner", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			fx.MustCommit(r, []byte("ready"))
			fx.SetLive(TargetA, false)
			res, err := fx.Store().Commit(fx.Ctx(), r.CommitRequest([]byte("ready")))
			require.NoError(t, err)
			require.Equal(t, authority.KindAlreadyCommitted, res.Kind)
		}},
		{"StaleAfterCommittedRowDeleted", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			ready := fx.MustCommit(r, []byte("ready"))
			fx.Delete(r.Key, ready.StoreVersion)
			stale(t, fx, r.CommitRequest([]byte("ready")))
		}},
		{"StaleMissingRow", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			req := r.CommitRequest([]byte("ready"))
			req.Key.GlobalID = "other"
			stale(t, fx, req)
		}},
		{"StaleWrongReservationID", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			req := r.CommitRequest([]byte("ready"))
			req.ReservationID = "not-" + req.ReservationID
			stale(t, fx, req)
		}},
		{"StaleWrongVersion", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			other := fx.Reserve(authority.ObjectUserSpot, "s2", TargetA)
			req := r.CommitRequest([]byte("ready"))
			req.ExpectedStoreVersion = other.Res.Creating.StoreVersion
			stale(t, fx, req)
		}},
		{"StaleWrongTargetOwner", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			req := r.CommitRequest([]byte("ready"))
			req.Target = TargetB
			stale(t, fx, req)
		}},
		{"StaleWrongTargetNode", func(t *testing.T, fx *Fixture) {
			// The node (mesh and RID) is part of
			// the target, not only the owner and lifecycle generation.
			r := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			for _, target := range fx.TargetsElsewhere(TargetA) {
				req := r.CommitRequest([]byte("ready"))
				req.Target = target
				stale(t, fx, req)
			}
			fx.MustCommit(r, []byte("ready"))
		}},
		{"StaleWrongTargetLifecycle", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			req := r.CommitRequest([]byte("ready"))
			req.Target.NodeLifecycleGeneration++
			fx.SetLive(req.Target, true)
			stale(t, fx, req)
		}},
		{"StaleTargetNotLive", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			fx.SetLive(TargetA, false)
			stale(t, fx, r.CommitRequest([]byte("ready")))
			fx.SetLive(TargetA, true)
			fx.MustCommit(r, []byte("ready"))
		}},
		{"StaleAfterAbort", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			res, err := fx.Store().Abort(fx.Ctx(), r.AbortRequest())
			require.NoError(t, err)
			require.Equal(t, authority.KindAborted, res.Kind)
			stale(t, fx, r.CommitRequest([]byte("ready")))
		}},
		{"StaleRetryAfterKeyRecreated", func(t *testing.T, fx *Fixture) {
			// A retry of a committed reservation after its row was deleted
			// and the key reserved again meets a reserved row of another
			// reservation: stale, and the new reservation is untouched.
			r1 := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			ready := fx.MustCommit(r1, []byte("ready"))
			fx.Delete(r1.Key, ready.StoreVersion)
			r2 := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			stale(t, fx, r1.CommitRequest([]byte("ready")))
			RequireSameRow(t, r2.Res.Creating, fx.MustRow(r2.Key))
			fx.MustCommit(r2, []byte("ready-2"))
		}},
		{"StaleRetryAfterOwnerRemovedAndKeyRecreated", func(t *testing.T, fx *Fixture) {
			r1 := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			fx.MustCommit(r1, []byte("ready"))
			n, err := fx.Store().RemoveAllByOwner(fx.Ctx(), OwnerA)
			require.NoError(t, err)
			require.Equal(t, int64(1), n)
			r2 := fx.Reserve(authority.ObjectUserSpot, "s1", TargetB)
			stale(t, fx, r1.CommitRequest([]byte("ready")))
			RequireSameRow(t, r2.Res.Creating, fx.MustRow(r2.Key))
			fx.RequireUsage(NodeB, authority.ObjectUserSpot, DefaultStableType, 0, 1)
			fx.MustCommit(r2, []byte("ready-2"))
		}},
		{"StaleRetryAfterAbortAndReReserve", func(t *testing.T, fx *Fixture) {
			r1 := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			res, err := fx.Store().Abort(fx.Ctx(), r1.AbortRequest())
			require.NoError(t, err)
			require.Equal(t, authority.KindAborted, res.Kind)
			r2 := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			stale(t, fx, r1.CommitRequest([]byte("ready")))
			RequireSameRow(t, r2.Res.Creating, fx.MustRow(r2.Key))
		}},
		{"RetryAfterKeyRecreatedAndCommittedReportsNewRow", func(t *testing.T, fx *Fixture) {
			// A committed reservation's retry is answered with
			// alreadyCommitted and the row now active at the key, whichever
			// reservation made it; nothing is committed again. The caller
			// tells the rows apart by ObjectGeneration.
			r1 := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			ready1 := fx.MustCommit(r1, []byte("ready"))
			fx.Delete(r1.Key, ready1.StoreVersion)
			r2 := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			ready2 := fx.MustCommit(r2, []byte("ready-2"))
			got := alreadyCommitted(t, fx, r1, ready2)
			require.Greater(t, got.ObjectGeneration, ready1.ObjectGeneration, "the row reported is the re-created one")
		}},
		{"StaleAfterRemoveAllByOwner", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			n, err := fx.Store().RemoveAllByOwner(fx.Ctx(), OwnerA)
			require.NoError(t, err)
			require.Equal(t, int64(1), n)
			stale(t, fx, r.CommitRequest([]byte("ready")))
		}},
	})
}
