package conformance

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
)

// RunTestReserve checks every outcome of Reserve and the order of its checks:
// identityClaimed, then an existing row (typeMismatch, alreadyExists,
// conflict), then target liveness, then placement capacity.
func RunTestReserve(ctx context.Context, t *testing.T, f Factory) {
	runSubtests(ctx, t, f, []subtest{
		{"Reserved", func(t *testing.T, fx *Fixture) {
			req := fx.ReserveRequest(authority.ObjectUserSpot, "s1", TargetA)
			r := fx.MustReserve(req)
			c := r.Res.Creating
			require.NotEmpty(t, r.Res.ReservationID)
			require.NotEmpty(t, c.StoreVersion)
			require.Equal(t, req.CreatingPayload, c.Payload)
			require.Equal(t, OwnerA, c.Owner())
			require.Equal(t, authority.AllocationReserved, c.Allocation.State)
			require.Equal(t, authority.ObjectUserSpot, c.Allocation.ObjectKind)
			require.Equal(t, DefaultStableType, c.Allocation.StableType)
			require.Equal(t, NodeA, c.Allocation.Descriptor)
			require.Equal(t, NodeLifecycle, c.Allocation.DescriptorLifecycleGeneration)
			require.True(t, req.Capacity.Equal(c.Allocation.Capacity))
			require.NotNil(t, c.PendingCreation)
			require.Equal(t, r.Res.ReservationID, c.PendingCreation.ReservationID)
			require.Equal(t, req.Intent.RequestContentReference, c.PendingCreation.RequestContentReference)
			require.Equal(t, req.Intent.RequestSHA256, c.PendingCreation.RequestSHA256)
			require.Equal(t, req.Intent.RequestEncodedSize, c.PendingCreation.RequestEncodedSize)
			RequireSameRow(t, c, fx.MustRow(r.Key))
		}},
		{"ReservesInstanceSpot", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectInstanceSpot, "i1", TargetA)
			require.Equal(t, authority.ObjectInstanceSpot, r.Res.Creating.Allocation.ObjectKind)
			fx.RequireUsage(NodeA, authority.ObjectInstanceSpot, DefaultStableType, 0, 1)
		}},
		{"ReservationIDsAndVersionsDistinct", func(t *testing.T, fx *Fixture) {
			ids := map[string]bool{}
			versions := map[authority.StoreVersion]bool{}
			for _, id := range []string{"a", "b", "c"} {
				r := fx.Reserve(authority.ObjectActor, id, TargetA)
				ids[r.Res.ReservationID] = true
				versions[r.Res.Creating.StoreVersion] = true
			}
			require.Len(t, ids, 3)
			require.Len(t, versions, 3)
		}},
		{"AlreadyExists", func(t *testing.T, fx *Fixture) {
			s := fx.Active(authority.ObjectUserSpot, "s1", TargetA)
			before := fx.State()
			res, err := fx.Store().Reserve(fx.Ctx(), fx.ReserveRequest(authority.ObjectUserSpot, "s1", TargetA))
			require.NoError(t, err)
			require.Equal(t, authority.KindAlreadyExists, res.Kind)
			require.Equal(t, authority.KindSnapshot, res.Current.Kind)
			RequireSameRow(t, s, res.Current.Snapshot)
			fx.RequireState(before)
		}},
		{"ConflictWhileReserved", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			before := fx.State()
			res, err := fx.Store().Reserve(fx.Ctx(), fx.ReserveRequest(authority.ObjectUserSpot, "s1", TargetB))
			require.NoError(t, err)
			require.Equal(t, authority.KindConflict, res.Kind)
			require.Equal(t, authority.KindSnapshot, res.Current.Kind)
			RequireSameRow(t, r.Res.Creating, res.Current.Snapshot)
			fx.RequireState(before)
		}},
		{"TypeMismatchStableType", func(t *testing.T, fx *Fixture) {
			s := fx.Active(authority.ObjectUserSpot, "s1", TargetA)
			before := fx.State()
			req := fx.ReserveRequest(authority.ObjectUserSpot, "s1", TargetA)
			req.Intent.StableType = "type-b"
			res, err := fx.Store().Reserve(fx.Ctx(), req)
			require.NoError(t, err)
			require.Equal(t, authority.KindTypeMismatch, res.Kind)
			RequireSameRow(t, s, res.Current.Snapshot)
			fx.RequireState(before)
		}},
		{"TypeMismatchBeforeReservedConflict", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectActor, "a1", TargetA)
			req := fx.ReserveRequest(authority.ObjectActor, "a1", TargetA)
			req.Intent.StableType = "type-b"
			res, err := fx.Store().Reserve(fx.Ctx(), req)
			require.NoError(t, err)
			require.Equal(t, authority.KindTypeMismatch, res.Kind)
			RequireSameRow(t, r.Res.Creating, res.Current.Snapshot)
		}},
		{"ConflictTargetNotLive", func(t *testing.T, fx *Fixture) {
			dead := Target(NodeA, NodeLifecycle, authority.OwnerToken{OwnerID: "owner-dead", LeaseGeneration: 1})
			before := fx.State()
			res, err := fx.Store().Reserve(fx.Ctx(), fx.ReserveRequest(authority.ObjectActor, "a1", dead))
			require.NoError(t, err)
			require.Equal(t, authority.KindConflict, res.Kind)
			require.Equal(t, authority.KindMissing, res.Current.Kind)
			fx.RequireState(before)
			fx.RequireMissing(fx.Key(authority.ObjectActor, "a1"))
		}},
		{"ConflictTargetMarkedDead", func(t *testing.T, fx *Fixture) {
			fx.SetLive(TargetA, false)
			before := fx.State()
			res, err := fx.Store().Reserve(fx.Ctx(), fx.ReserveRequest(authority.ObjectActor, "a1", TargetA))
			require.NoError(t, err, "a reserve by a lease no longer live is an outcome, not an error")
			require.Equal(t, authority.KindConflict, res.Kind)
			require.Equal(t, authority.KindMissing, res.Current.Kind, "ReserveResult: a target not live reads the row missing")
			fx.RequireState(before)
			fx.SetLive(TargetA, true)
			fx.Reserve(authority.ObjectActor, "a1", TargetA)
		}},
		{"ConflictOtherLifecycleGeneration", func(t *testing.T, fx *Fixture) {
			res, err := fx.Store().Reserve(fx.Ctx(), fx.ReserveRequest(authority.ObjectActor, "a1", Target(NodeA, NodeLifecycle+1, OwnerA)))
			require.NoError(t, err)
			require.Equal(t, authority.KindConflict, res.Kind, "liveness is per lifecycle generation")
		}},
		{"ConflictIdentityClaimed", func(t *testing.T, fx *Fixture) {
			if fx.H.ClaimIdentity == nil {
				t.Skip("provider cannot claim identities")
			}
			key := fx.Key(authority.ObjectUserSpot, "claimed")
			fx.H.ClaimIdentity(t, key)
			before := fx.State()
			res, err := fx.Store().Reserve(fx.Ctx(), fx.ReserveRequest(authority.ObjectUserSpot, "claimed", TargetA))
			require.NoError(t, err)
			require.Equal(t, authority.KindConflict, res.Kind)
			require.Equal(t, authority.KindMissing, res.Current.Kind)
			fx.RequireState(before)
			fx.Reserve(authority.ObjectUserSpot, "unclaimed", TargetA)
		}},
		{"IdentityClaimedCheckedFirst", func(t *testing.T, fx *Fixture) {
			if fx.H.ClaimIdentity == nil {
				t.Skip("provider cannot claim identities")
			}
			fx.Active(authority.ObjectUserSpot, "s1", TargetA)
			fx.H.ClaimIdentity(t, fx.Key(authority.ObjectUserSpot, "s1"))
			res, err := fx.Store().Reserve(fx.Ctx(), fx.ReserveRequest(authority.ObjectUserSpot, "s1", TargetA))
			require.NoError(t, err)
			require.Equal(t, authority.KindConflict, res.Kind, "identityClaimed comes before alreadyExists")
			require.Equal(t, authority.KindMissing, res.Current.Kind)
		}},
		{"PlacementCapacityExhausted", func(t *testing.T, fx *Fixture) {
			needCapacityPolicy(t, fx)
			fx.H.SetCapacityPolicy(t, ActorLimit(0))
			before := fx.State()
			res, err := fx.Store().Reserve(fx.Ctx(), fx.ReserveRequest(authority.ObjectActor, "a1", TargetA))
			require.NoError(t, err)
			require.Equal(t, authority.KindPlacementCapacityExhausted, res.Kind)
			fx.RequireState(before)
		}},
		{"LivenessBeforeCapacity", func(t *testing.T, fx *Fixture) {
			needCapacityPolicy(t, fx)
			fx.H.SetCapacityPolicy(t, ActorLimit(0))
			fx.SetLive(TargetA, false)
			res, err := fx.Store().Reserve(fx.Ctx(), fx.ReserveRequest(authority.ObjectActor, "a1", TargetA))
			require.NoError(t, err)
			require.Equal(t, authority.KindConflict, res.Kind)
		}},
		{"ExistingRowBeforeCapacity", func(t *testing.T, fx *Fixture) {
			needCapacityPolicy(t, fx)
			fx.Active(authority.ObjectActor, "a1", TargetA)
			fx.H.SetCapacityPolicy(t, ActorLimit(0))
			res, err := fx.Store().Reserve(fx.Ctx(), fx.ReserveRequest(authority.ObjectActor, "a1", TargetA))
			require.NoError(t, err)
			require.Equal(t, authority.KindAlreadyExists, res.Kind)
		}},
		{"ObjectGenerationGrowsAcrossRecreation", func(t *testing.T, fx *Fixture) {
			r1 := fx.Reserve(authority.ObjectActor, "a1", TargetA)
			res, err := fx.Store().Abort(fx.Ctx(), r1.AbortRequest())
			require.NoError(t, err)
			require.Equal(t, authority.KindAborted, res.Kind)
			r2 := fx.Reserve(authority.ObjectActor, "a1", TargetA)
			require.Greater(t, r2.Res.Creating.ObjectGeneration, r1.Res.Creating.ObjectGeneration)
			require.NotEqual(t, r1.Res.ReservationID, r2.Res.ReservationID)
			require.NotEqual(t, r1.Res.Creating.StoreVersion, r2.Res.Creating.StoreVersion)
			ready := fx.MustComplete(r2, authority.TerminalCreated, []byte("ready"), fx.Publication()).Ready
			fx.Delete(r2.Key, ready.StoreVersion)
			r3 := fx.Reserve(authority.ObjectActor, "a1", TargetA)
			require.Greater(t, r3.Res.Creating.ObjectGeneration, r2.Res.Creating.ObjectGeneration)
		}},
		{"CountsReservedCapacity", func(t *testing.T, fx *Fixture) {
			fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			fx.RequireUsage(NodeA, authority.ObjectUserSpot, DefaultStableType, 0, 1)
			fx.RequireUsage(NodeA, authority.CounterSpots, "", 0, 1)
			fx.RequireUsage(NodeA, authority.ObjectActor, "", 0, 0)
		}},
	})
}
