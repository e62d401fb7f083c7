package conformance

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
)

// RunTestCompareExchange checks CompareExchangeAuthority: put, delete,
// rebindOwnerLease and restore, with live and dead owners, and conflicts
// that report the row as it is.
func RunTestCompareExchange(ctx context.Context, t *testing.T, f Factory) {
	cas := func(t *testing.T, fx *Fixture, key authority.Key, v authority.StoreVersion, m authority.Mutation) authority.CompareExchangeResult {
		t.Helper()
		res, err := fx.Store().CompareExchangeAuthority(fx.Ctx(), key, v, m)
		require.NoError(t, err)
		return res
	}
	// conflict requires a conflict that leaves the store unchanged and
	// reports the row as ReadAuthority sees it.
	conflict := func(t *testing.T, fx *Fixture, key authority.Key, v authority.StoreVersion, m authority.Mutation) {
		t.Helper()
		before := fx.State()
		res := cas(t, fx, key, v, m)
		require.Equal(t, authority.KindConflict, res.Kind)
		cur := fx.Read(key)
		require.Equal(t, cur.Kind, res.Current.Kind)
		if cur.Kind == authority.KindSnapshot {
			RequireSameRow(t, cur.Snapshot, res.Current.Snapshot)
		}
		fx.RequireState(before)
	}
	active := func(fx *Fixture) (authority.Key, *authority.Snapshot) {
		s := fx.Active(authority.ObjectUserSpot, "s1", TargetA)
		return fx.Key(authority.ObjectUserSpot, "s1"), s
	}
	lease2 := authority.OwnerToken{OwnerID: OwnerA.OwnerID, LeaseGeneration: OwnerA.LeaseGeneration + 1}
	runSubtests(ctx, t, f, []subtest{
		{"PutStored", func(t *testing.T, fx *Fixture) {
			key, s := active(fx)
			res := cas(t, fx, key, s.StoreVersion, authority.Put([]byte("v2")))
			require.Equal(t, authority.KindStored, res.Kind)
			got := res.Snapshot
			require.Equal(t, []byte("v2"), got.Payload)
			require.NotEqual(t, s.StoreVersion, got.StoreVersion)
			require.Equal(t, s.ObjectGeneration, got.ObjectGeneration)
			require.Equal(t, s.AuthorityOwnerGeneration, got.AuthorityOwnerGeneration, "a put is no owner transition")
			require.Equal(t, s.Owner(), got.Owner())
			require.Equal(t, s.Allocation, got.Allocation)
			require.False(t, res.StoreNow.IsZero() && got.StoreNow.IsZero())
			RequireSameRow(t, got, fx.MustRow(key))
		}},
		{"PutEmptyPayload", func(t *testing.T, fx *Fixture) {
			key, s := active(fx)
			res := cas(t, fx, key, s.StoreVersion, authority.Put(nil))
			require.Equal(t, authority.KindStored, res.Kind)
			require.Empty(t, fx.MustRow(key).Payload)
		}},
		{"PutMaxPayload", func(t *testing.T, fx *Fixture) {
			key, s := active(fx)
			big := make([]byte, authority.MaxPayloadBytes)
			big[len(big)-1] = 7
			res := cas(t, fx, key, s.StoreVersion, authority.Put(big))
			require.Equal(t, authority.KindStored, res.Kind)
			require.Equal(t, big, fx.MustRow(key).Payload)
		}},
		{"EveryWriteNewVersion", func(t *testing.T, fx *Fixture) {
			key, s := active(fx)
			seen := map[authority.StoreVersion]bool{s.StoreVersion: true}
			v := s.StoreVersion
			for i := 0; i < 5; i++ {
				// The same payload each time: the version still changes.
				got := fx.Put(key, v, []byte("same"))
				require.False(t, seen[got.StoreVersion], "version %s repeated", got.StoreVersion)
				seen[got.StoreVersion] = true
				v = got.StoreVersion
			}
		}},
		{"PutConflictOldVersion", func(t *testing.T, fx *Fixture) {
			key, s := active(fx)
			fx.Put(key, s.StoreVersion, []byte("v2"))
			conflict(t, fx, key, s.StoreVersion, authority.Put([]byte("v3")))
		}},
		{"PutConflictMissingRow", func(t *testing.T, fx *Fixture) {
			_, s := active(fx)
			conflict(t, fx, fx.Key(authority.ObjectUserSpot, "nobody"), s.StoreVersion, authority.Put([]byte("x")))
		}},
		{"PutConflictReservedRow", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			conflict(t, fx, r.Key, r.Res.Creating.StoreVersion, authority.Put([]byte("x")))
		}},
		{"PutConflictOwnerNotLive", func(t *testing.T, fx *Fixture) {
			key, s := active(fx)
			fx.SetLive(TargetA, false)
			conflict(t, fx, key, s.StoreVersion, authority.Put([]byte("x")))
			fx.SetLive(TargetA, true)
			fx.Put(key, s.StoreVersion, []byte("x"))
		}},
		{"DeleteDeleted", func(t *testing.T, fx *Fixture) {
			key, s := active(fx)
			fx.RequireUsage(NodeA, authority.ObjectUserSpot, DefaultStableType, 1, 0)
			res := cas(t, fx, key, s.StoreVersion, authority.Delete())
			require.Equal(t, authority.KindDeleted, res.Kind)
			require.NotEmpty(t, res.StoreVersion)
			require.NotEqual(t, s.StoreVersion, res.StoreVersion)
			require.False(t, res.StoreNow.IsZero())
			fx.RequireMissing(key)
			fx.RequireUsage(NodeA, authority.ObjectUserSpot, DefaultStableType, 0, 0)
			fx.RequireUsage(NodeA, authority.CounterSpots, "", 0, 0)
		}},
		{"DeleteConflictOwnerNotLive", func(t *testing.T, fx *Fixture) {
			key, s := active(fx)
			fx.SetLive(TargetA, false)
			conflict(t, fx, key, s.StoreVersion, authority.Delete())
		}},
		{"DeleteConflictOldVersion", func(t *testing.T, fx *Fixture) {
			key, s := active(fx)
			fx.Put(key, s.StoreVersion, []byte("v2"))
			conflict(t, fx, key, s.StoreVersion, authority.Delete())
		}},
		{"DeleteConflictMissingRow", func(t *testing.T, fx *Fixture) {
			key, s := active(fx)
			require.Equal(t, authority.KindDeleted, cas(t, fx, key, s.StoreVersion, authority.Delete()).Kind)
			conflict(t, fx, key, s.StoreVersion, authority.Delete())
		}},
		{"DeleteConflictReservedRow", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectActor, "a1", TargetA)
			conflict(t, fx, r.Key, r.Res.Creating.StoreVersion, authority.Delete())
		}},
		{"RebindStored", func(t *testing.T, fx *Fixture) {
			key, s := active(fx)
			fx.SetLive(Target(NodeA, NodeLifecycle, lease2), true)
			res := cas(t, fx, key, s.StoreVersion, authority.RebindOwnerLease(OwnerA, lease2, []byte("rebound")))
			require.Equal(t, authority.KindStored, res.Kind)
			got := res.Snapshot
			require.Equal(t, lease2, got.Owner())
			require.Equal(t, []byte("rebound"), got.Payload)
			require.NotEqual(t, s.StoreVersion, got.StoreVersion)
			require.Equal(t, s.ObjectGeneration, got.ObjectGeneration)
			require.Equal(t, s.AuthorityOwnerGeneration, got.AuthorityOwnerGeneration, "a lease rebind keeps the owner generation")
			require.Equal(t, s.Allocation, got.Allocation)
			RequireSameRow(t, got, fx.MustRow(key))
		}},
		{"RebindWithCurrentLeaseDead", func(t *testing.T, fx *Fixture) {
			key, s := active(fx)
			fx.SetLive(TargetA, false)
			fx.SetLive(Target(NodeA, NodeLifecycle, lease2), true)
			res := cas(t, fx, key, s.StoreVersion, authority.RebindOwnerLease(OwnerA, lease2, []byte("rebound")))
			require.Equal(t, authority.KindStored, res.Kind, "rebind needs only the target lease live")
			// The rebound row is writable under its new live lease.
			fx.Put(key, res.Snapshot.StoreVersion, []byte("after"))
		}},
		{"RebindConflictTargetNotLive", func(t *testing.T, fx *Fixture) {
			key, s := active(fx)
			conflict(t, fx, key, s.StoreVersion, authority.RebindOwnerLease(OwnerA, lease2, []byte("x")))
		}},
		{"RebindConflictTargetLiveElsewhere", func(t *testing.T, fx *Fixture) {
			// The target lease must be live on the row's own node at
			// the row's lifecycle generation; live anywhere else is not enough.
			key, s := active(fx)
			fx.SetLive(Target(NodeB, NodeLifecycle, lease2), true)
			fx.SetLive(Target(NodeA, NodeLifecycle+1, lease2), true)
			conflict(t, fx, key, s.StoreVersion, authority.RebindOwnerLease(OwnerA, lease2, []byte("x")))
			fx.SetLive(Target(NodeA, NodeLifecycle, lease2), true)
			require.Equal(t, authority.KindStored, cas(t, fx, key, s.StoreVersion, authority.RebindOwnerLease(OwnerA, lease2, []byte("x"))).Kind)
		}},
		{"RebindConflictExpectedOwnerMismatch", func(t *testing.T, fx *Fixture) {
			key, s := active(fx)
			lease3 := authority.OwnerToken{OwnerID: OwnerA.OwnerID, LeaseGeneration: OwnerA.LeaseGeneration + 2}
			fx.SetLive(Target(NodeA, NodeLifecycle, lease3), true)
			conflict(t, fx, key, s.StoreVersion, authority.RebindOwnerLease(lease2, lease3, []byte("x")))
		}},
		{"RebindConflictOtherOwner", func(t *testing.T, fx *Fixture) {
			key, s := active(fx)
			other := authority.OwnerToken{OwnerID: "owner-c", LeaseGeneration: 1}
			other2 := authority.OwnerToken{OwnerID: "owner-c", LeaseGeneration: 2}
			fx.SetLive(Target(NodeA, NodeLifecycle, other2), true)
			conflict(t, fx, key, s.StoreVersion, authority.RebindOwnerLease(other, other2, []byte("x")))
		}},
		{"RebindConflictOldVersion", func(t *testing.T, fx *Fixture) {
			key, s := active(fx)
			fx.Put(key, s.StoreVersion, []byte("v2"))
			fx.SetLive(Target(NodeA, NodeLifecycle, lease2), true)
			conflict(t, fx, key, s.StoreVersion, authority.RebindOwnerLease(OwnerA, lease2, []byte("x")))
		}},
		{"RebindMovesRemoveAllByOwner", func(t *testing.T, fx *Fixture) {
			key, s := active(fx)
			fx.SetLive(Target(NodeA, NodeLifecycle, lease2), true)
			require.Equal(t, authority.KindStored, cas(t, fx, key, s.StoreVersion, authority.RebindOwnerLease(OwnerA, lease2, nil)).Kind)
			n, err := fx.Store().RemoveAllByOwner(fx.Ctx(), OwnerA)
			require.NoError(t, err)
			require.Zero(t, n, "the old lease owns nothing after a rebind")
			n, err = fx.Store().RemoveAllByOwner(fx.Ctx(), lease2)
			require.NoError(t, err)
			require.Equal(t, int64(1), n)
			fx.RequireMissing(key)
		}},
		{"RestoreStoredOwnerDead", func(t *testing.T, fx *Fixture) {
			key, s := active(fx)
			fx.SetLive(TargetA, false)
			res := cas(t, fx, key, s.StoreVersion, authority.Restore(OwnerA, []byte("restored")))
			require.Equal(t, authority.KindStored, res.Kind, "restore needs no live owner")
			got := res.Snapshot
			require.Equal(t, []byte("restored"), got.Payload)
			require.Equal(t, OwnerA, got.Owner())
			require.NotEqual(t, s.StoreVersion, got.StoreVersion)
			require.Equal(t, s.AuthorityOwnerGeneration, got.AuthorityOwnerGeneration)
			RequireSameRow(t, got, fx.MustRow(key))
		}},
		{"RestoreStoredOwnerLive", func(t *testing.T, fx *Fixture) {
			key, s := active(fx)
			res := cas(t, fx, key, s.StoreVersion, authority.Restore(OwnerA, []byte("restored")))
			require.Equal(t, authority.KindStored, res.Kind)
			require.Equal(t, []byte("restored"), fx.MustRow(key).Payload)
		}},
		{"RestoreConflictOtherOwner", func(t *testing.T, fx *Fixture) {
			key, s := active(fx)
			conflict(t, fx, key, s.StoreVersion, authority.Restore(OwnerB, []byte("x")))
			conflict(t, fx, key, s.StoreVersion, authority.Restore(lease2, []byte("x")))
		}},
		{"RestoreConflictOldVersion", func(t *testing.T, fx *Fixture) {
			key, s := active(fx)
			fx.Put(key, s.StoreVersion, []byte("v2"))
			conflict(t, fx, key, s.StoreVersion, authority.Restore(OwnerA, []byte("x")))
		}},
		{"RestoreConflictReservedRow", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectActor, "a1", TargetA)
			conflict(t, fx, r.Key, r.Res.Creating.StoreVersion, authority.Restore(OwnerA, []byte("x")))
		}},
		{"ConflictReportsCurrentRow", func(t *testing.T, fx *Fixture) {
			key, s := active(fx)
			put := fx.Put(key, s.StoreVersion, []byte("v2"))
			res := cas(t, fx, key, s.StoreVersion, authority.Put([]byte("v3")))
			require.Equal(t, authority.KindConflict, res.Kind)
			require.Equal(t, authority.KindSnapshot, res.Current.Kind)
			RequireSameRow(t, put, res.Current.Snapshot)
			// The conflict's version is good for a retry.
			fx.Put(key, res.Current.Snapshot.StoreVersion, []byte("v3"))
		}},
		{"OtherRowsUntouched", func(t *testing.T, fx *Fixture) {
			key, s := active(fx)
			other := fx.Active(authority.ObjectUserSpot, "s2", TargetA)
			fx.Put(key, s.StoreVersion, []byte("v2"))
			RequireSameRow(t, other, fx.MustRow(fx.Key(authority.ObjectUserSpot, "s2")))
		}},
	})
}
