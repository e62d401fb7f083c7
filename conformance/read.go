package conformance

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
)

// RunTestReadAuthority checks ReadAuthority: missing rows, reserved and
// active rows, copies and version stability.
func RunTestReadAuthority(ctx context.Context, t *testing.T, f Factory) {
	runSubtests(ctx, t, f, []subtest{
		{"MissingRow", func(t *testing.T, fx *Fixture) {
			res := fx.Read(fx.Key(authority.ObjectActor, "nobody"))
			require.Equal(t, authority.KindMissing, res.Kind)
			require.Nil(t, res.Snapshot)
			require.False(t, res.StoreNow.IsZero(), "missing read carries the store's clock")
		}},
		{"ReservedRow", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			got := fx.MustRow(r.Key)
			RequireSameRow(t, r.Res.Creating, got)
			require.Equal(t, authority.AllocationReserved, got.Allocation.State)
			require.NotNil(t, got.PendingCreation)
			require.Equal(t, r.Res.ReservationID, got.PendingCreation.ReservationID)
			require.Equal(t, r.Req.CreatingPayload, got.Payload)
			require.False(t, got.StoreNow.IsZero())
		}},
		{"ActiveRow", func(t *testing.T, fx *Fixture) {
			s := fx.Active(authority.ObjectActor, "a1", TargetA)
			got := fx.MustRow(fx.Key(authority.ObjectActor, "a1"))
			RequireSameRow(t, s, got)
			require.Equal(t, authority.AllocationActive, got.Allocation.State)
			require.Nil(t, got.PendingCreation)
			require.Equal(t, OwnerA, got.Owner())
		}},
		{"VersionStableWithoutWrites", func(t *testing.T, fx *Fixture) {
			s := fx.Active(authority.ObjectUserSpot, "s1", TargetA)
			fx.Active(authority.ObjectUserSpot, "s2", TargetA)
			a := fx.MustRow(fx.Key(authority.ObjectUserSpot, "s1"))
			b := fx.MustRow(fx.Key(authority.ObjectUserSpot, "s1"))
			require.Equal(t, s.StoreVersion, a.StoreVersion, "a write to another row must not change this row's version")
			require.Equal(t, a.StoreVersion, b.StoreVersion)
		}},
		{"ReturnsCopies", func(t *testing.T, fx *Fixture) {
			s := fx.Active(authority.ObjectUserSpot, "s1", TargetA)
			key := fx.Key(authority.ObjectUserSpot, "s1")
			got := fx.MustRow(key)
			want := string(got.Payload)
			for i := range got.Payload {
				got.Payload[i] = 'X'
			}
			got.Allocation.Capacity.SpotType.Count = 99
			s.Payload = append(s.Payload[:0], 'Y')
			again := fx.MustRow(key)
			require.Equal(t, want, string(again.Payload))
			require.Equal(t, int64(1), again.Allocation.Capacity.SpotType.Count)
		}},
		{"StoreNowFollowsClock", func(t *testing.T, fx *Fixture) {
			needClock(t, fx)
			key := fx.Key(authority.ObjectActor, "a1")
			fx.Active(authority.ObjectActor, "a1", TargetA)
			before := fx.MustRow(key).StoreNow
			fx.H.AdvanceClock(t, time.Hour)
			after := fx.MustRow(key).StoreNow
			require.False(t, after.Before(before.Add(time.Hour)), "StoreNow %v after advancing from %v", after, before)
		}},
	})
}
