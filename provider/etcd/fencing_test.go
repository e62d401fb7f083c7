package etcd_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// zombieRows are rows of one owner in every state a zombie might touch.
type zombieRows struct {
	active *authority.Snapshot
	spot   conformance.Reservation
	actor  conformance.Reservation
}

func placeZombieRows(fx *conformance.Fixture, tgt authority.CreationTarget) zombieRows {
	return zombieRows{
		active: fx.Active(authority.ObjectUserSpot, "active", tgt),
		spot:   fx.Reserve(authority.ObjectUserSpot, "pending-spot", tgt),
		actor:  fx.Reserve(authority.ObjectActor, "pending-actor", tgt),
	}
}

// requireZombie checks that the owner of tgt can no longer write, reserve,
// commit, complete or join an aggregate, and that nothing changed.
func requireZombie(t *testing.T, fx *conformance.Fixture, tgt authority.CreationTarget, z zombieRows) {
	t.Helper()
	ctx := fx.Ctx()
	st := fx.Store()
	before := fx.State()
	key := fx.Key(authority.ObjectUserSpot, "active")

	cas, err := st.CompareExchangeAuthority(ctx, key, z.active.StoreVersion, authority.Put([]byte("zombie")))
	require.NoError(t, err)
	require.Equal(t, authority.KindConflict, cas.Kind)
	cas, err = st.CompareExchangeAuthority(ctx, key, z.active.StoreVersion, authority.Delete())
	require.NoError(t, err)
	require.Equal(t, authority.KindConflict, cas.Kind)

	res, err := st.Reserve(ctx, fx.ReserveRequest(authority.ObjectActor, "new", tgt))
	require.NoError(t, err)
	require.Equal(t, authority.KindConflict, res.Kind)

	com, err := st.Commit(ctx, z.spot.CommitRequest([]byte("ready")))
	require.NoError(t, err)
	require.Equal(t, authority.KindStale, com.Kind)

	done, err := st.CompleteCreation(ctx, z.actor.CompleteRequest(authority.TerminalCreated, []byte("ready"), fx.Publication()))
	require.NoError(t, err)
	require.Equal(t, authority.KindStale, done.Kind)

	agg := conformance.AggregateRequest("zombie-agg", 1, conformance.TargetB, authority.CapacityVector{Actors: 1},
		conformance.Participant(key, z.active.StoreVersion, authority.TransitionPreserve, []byte("agg")))
	prep, err := st.PrepareAggregate(ctx, agg)
	require.NoError(t, err)
	require.Equal(t, authority.KindConflict, prep.Kind)

	fx.RequireState(before)
}

func TestZombieOwnerRevokedLeaseCannotWrite(t *testing.T) {
	h := etcdFactory(t)
	fx := conformance.NewFixture(t, h)
	s := h.Store.(*etcdstore.Store)
	ctx := context.Background()
	lease, err := s.Registry().Acquire(ctx, conformance.NodeA, conformance.NodeLifecycle, "zombie", 10*time.Second)
	require.NoError(t, err)
	tgt := conformance.Target(conformance.NodeA, conformance.NodeLifecycle, lease.Token())
	z := placeZombieRows(fx, tgt)

	// the owner is live: its writes pass
	fx.Put(fx.Key(authority.ObjectUserSpot, "active"), z.active.StoreVersion, []byte("live write"))
	z.active = fx.MustRow(fx.Key(authority.ObjectUserSpot, "active"))

	require.NoError(t, lease.Close(ctx))
	<-lease.Done()
	requireZombie(t, fx, tgt, z)
}

func TestZombieOwnerExpiredLeaseCannotWrite(t *testing.T) {
	h := etcdFactory(t)
	fx := conformance.NewFixture(t, h)
	s := h.Store.(*etcdstore.Store)
	ctx := context.Background()
	owner := authority.OwnerToken{OwnerID: "expiring", LeaseGeneration: 7}
	tgt := conformance.Target(conformance.NodeA, conformance.NodeLifecycle, owner)

	// a watch on the owners' liveness keys sees the lease expire
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	events := shared.Watch(wctx, s.Namespace()+"owners/", clientv3.WithPrefix())
	require.NoError(t, s.MarkLive(ctx, tgt.Descriptor(), tgt.NodeLifecycleGeneration, owner, 2*time.Second))
	z := placeZombieRows(fx, tgt)

	for expired := false; !expired; {
		wr, ok := <-events
		require.True(t, ok, "watch ended before the lease expired")
		require.NoError(t, wr.Err())
		for _, ev := range wr.Events {
			expired = expired || ev.Type == clientv3.EventTypeDelete
		}
	}
	live, err := s.IsTargetLive(ctx, tgt.Descriptor(), tgt.NodeLifecycleGeneration, owner)
	require.NoError(t, err)
	require.False(t, live)
	requireZombie(t, fx, tgt, z)
}

func TestRegistryNewGenerationRebindsRows(t *testing.T) {
	h := etcdFactory(t)
	fx := conformance.NewFixture(t, h)
	s := h.Store.(*etcdstore.Store)
	ctx := context.Background()
	reg := s.Registry()
	first, err := reg.Acquire(ctx, conformance.NodeA, conformance.NodeLifecycle, "mover", 10*time.Second)
	require.NoError(t, err)
	defer first.Close(ctx)
	require.Equal(t, int64(1), first.Token().LeaseGeneration)
	oldTgt := conformance.Target(conformance.NodeA, conformance.NodeLifecycle, first.Token())
	for _, id := range []string{"r1", "r2", "r3"} {
		fx.Active(authority.ObjectActor, id, oldTgt)
	}
	pending := fx.Reserve(authority.ObjectActor, "pending", oldTgt)

	second, err := reg.Acquire(ctx, conformance.NodeA, conformance.NodeLifecycle, "mover", 10*time.Second)
	require.NoError(t, err)
	defer second.Close(ctx)
	require.Equal(t, int64(2), second.Token().LeaseGeneration)
	moved, err := second.RebindRows(ctx, first.Token())
	require.NoError(t, err)
	require.Equal(t, int64(3), moved)

	// the old generation dies; the rows live on under the new one
	require.NoError(t, first.Close(ctx))
	<-first.Done()
	for _, id := range []string{"r1", "r2", "r3"} {
		key := fx.Key(authority.ObjectActor, id)
		row := fx.MustRow(key)
		require.Equal(t, second.Token(), row.Owner())
		fx.Put(key, row.StoreVersion, []byte("after rebind"))
	}
	n, err := s.RemoveAllByOwner(ctx, first.Token())
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "only the pending reservation stayed with the old generation")
	fx.RequireMissing(pending.Key)
	n, err = s.RemoveAllByOwner(ctx, second.Token())
	require.NoError(t, err)
	require.Equal(t, int64(3), n)
	fx.RequireUsage(conformance.NodeA, authority.ObjectActor, "", 0, 0)
}
