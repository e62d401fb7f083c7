package memory

import (
	"testing"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
)

func TestCompareExchangePut(t *testing.T) {
	e := newEnv(t)
	key, ready := e.spot("s1")
	res := e.cas(key, ready.StoreVersion, authority.Put([]byte("p2")))
	require.Equal(t, authority.KindStored, res.Kind)
	require.NotEqual(t, ready.StoreVersion, res.Snapshot.StoreVersion)
	require.Equal(t, ready.AuthorityOwnerGeneration, res.Snapshot.AuthorityOwnerGeneration)
	require.Equal(t, []byte("p2"), res.Snapshot.Payload)
	require.Equal(t, testEpoch, res.StoreNow)

	// The old version conflicts and shows the current row.
	stale := e.cas(key, ready.StoreVersion, authority.Put([]byte("p3")))
	require.Equal(t, authority.KindConflict, stale.Kind)
	require.Equal(t, res.Snapshot.StoreVersion, stale.Current.Snapshot.StoreVersion)

	// A dead owner cannot put or delete.
	e.live.Set(nodeA, 1, ownerA, false)
	require.Equal(t, authority.KindConflict, e.cas(key, res.Snapshot.StoreVersion, authority.Put(nil)).Kind)
	require.Equal(t, authority.KindConflict, e.cas(key, res.Snapshot.StoreVersion, authority.Delete()).Kind)
	require.Equal(t, []byte("p2"), e.read(key).Snapshot.Payload)

	// Missing rows and reserved rows conflict.
	missing := e.cas("user_spot/none", "1", authority.Put(nil))
	require.Equal(t, authority.KindConflict, missing.Kind)
	require.Equal(t, authority.KindMissing, missing.Current.Kind)
	e.live.Set(nodeA, 1, ownerA, true)
	rr := e.reserve(spotRequest("s2", target(nodeA, ownerA)))
	require.Equal(t, authority.KindConflict, e.cas(mustKey(t, authority.ObjectKey{Kind: authority.ObjectUserSpot, GlobalID: "s2"}), rr.Creating.StoreVersion, authority.Put(nil)).Kind)
}

func TestCompareExchangeDelete(t *testing.T) {
	e := newEnv(t)
	key, ready := e.spot("s1")
	res := e.cas(key, ready.StoreVersion, authority.Delete())
	require.Equal(t, authority.KindDeleted, res.Kind)
	require.NotEqual(t, ready.StoreVersion, res.StoreVersion)
	require.Equal(t, authority.KindMissing, e.read(key).Kind)
	require.Equal(t, authority.CapacityUsage{}, e.usage(nodeA, authority.ObjectUserSpot, "chat"))
	// Re-creating the key gives a higher object generation.
	_, again := e.spot("s1")
	require.Greater(t, again.ObjectGeneration, ready.ObjectGeneration)
}

func TestCompareExchangeRebindAndRestore(t *testing.T) {
	e := newEnv(t)
	key, ready := e.spot("s1")
	lease2 := authority.OwnerToken{OwnerID: ownerA.OwnerID, LeaseGeneration: 2}

	// The target lease must be live.
	require.Equal(t, authority.KindConflict, e.cas(key, ready.StoreVersion, authority.RebindOwnerLease(ownerA, lease2, []byte("r"))).Kind)
	e.live.Set(nodeA, 1, lease2, true)
	// The expected owner must be the row's.
	lease3 := authority.OwnerToken{OwnerID: ownerA.OwnerID, LeaseGeneration: 3}
	require.Equal(t, authority.KindConflict, e.cas(key, ready.StoreVersion, authority.RebindOwnerLease(lease3, lease2, []byte("r"))).Kind)

	rebound := e.cas(key, ready.StoreVersion, authority.RebindOwnerLease(ownerA, lease2, []byte("rebound")))
	require.Equal(t, authority.KindStored, rebound.Kind)
	require.Equal(t, lease2, rebound.Snapshot.Owner())
	require.Equal(t, ready.AuthorityOwnerGeneration, rebound.Snapshot.AuthorityOwnerGeneration)
	require.Equal(t, []byte("rebound"), rebound.Snapshot.Payload)

	// Rebinding to the lease the row already has conflicts.
	require.Equal(t, authority.KindConflict, e.cas(key, rebound.Snapshot.StoreVersion, authority.RebindOwnerLease(lease3, lease2, nil)).Kind)

	// Restore works with a dead owner, but only for the row's owner.
	e.live.Set(nodeA, 1, lease2, false)
	require.Equal(t, authority.KindConflict, e.cas(key, rebound.Snapshot.StoreVersion, authority.Restore(ownerA, []byte("x"))).Kind)
	restored := e.cas(key, rebound.Snapshot.StoreVersion, authority.Restore(lease2, []byte("restored")))
	require.Equal(t, authority.KindStored, restored.Kind)
	require.Equal(t, []byte("restored"), e.read(key).Snapshot.Payload)
}

func TestRemoveAllByOwner(t *testing.T) {
	e := newEnv(t)
	e.spot("s1")
	e.spot("s2")
	e.reserve(spotRequest("s3", target(nodeA, ownerA)))
	e.reserve(actorRequest("a1", target(nodeA, ownerA)))
	kept := e.reserve(spotRequest("s4", target(nodeB, ownerB)))
	other := authority.OwnerToken{OwnerID: ownerA.OwnerID, LeaseGeneration: 2}

	n, err := e.s.RemoveAllByOwner(e.ctx, other)
	require.NoError(t, err)
	require.Zero(t, n)
	n, err = e.s.RemoveAllByOwner(e.ctx, ownerA)
	require.NoError(t, err)
	require.Equal(t, int64(4), n)
	require.Equal(t, 1, e.state().rows)
	require.Equal(t, authority.CapacityUsage{}, e.usage(nodeA, authority.ObjectUserSpot, "chat"))
	require.Equal(t, authority.CapacityUsage{}, e.usage(nodeA, authority.ObjectActor, ""))
	require.Equal(t, authority.CapacityUsage{Reserved: 1}, e.usage(nodeB, authority.ObjectUserSpot, "chat"))
	require.Equal(t, kept.Creating.StoreVersion, e.read(mustKey(t, authority.ObjectKey{Kind: authority.ObjectUserSpot, GlobalID: "s4"})).Snapshot.StoreVersion)
}
