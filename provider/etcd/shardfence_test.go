package etcd_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
)

// putShardMap puts a one-shard map in s's namespace and returns the key's
// ModRevision (what a resharding does to it when it freezes or switches).
func putShardMap(t *testing.T, s *etcdstore.Store, epoch int64) int64 {
	t.Helper()
	m := schema.ShardMap{Epoch: epoch, Hash: "fnv1a64-jump", Shards: []schema.ShardMapShard{{ClusterID: "c1", Namespace: s.Namespace()}}}
	resp, err := shared.Put(context.Background(), schema.NewLayout(s.Namespace()).ShardMap(), m.Encode())
	require.NoError(t, err)
	return resp.Header.Revision
}

// TestShardMapFence: on a store fenced on the shard map, a write routed
// under a map revision the key has left fails with ErrShardMapChanged
// (ErrUnavailable) and writes nothing, whatever the operation; a read does
// too; routed under the key's revision they work; a context without a map
// revision is not fenced; a store without the option ignores it.
func TestShardMapFence(t *testing.T) {
	ctx := context.Background()
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, nil, etcdstore.Config{Clock: clock, ShardMapFence: true})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	key := fx.Key(authority.ObjectUserSpot, "fenced")
	row := fx.Active(authority.ObjectUserSpot, "fenced", conformance.TargetA)

	// no map yet: the fence is ModRevision 0
	at0 := etcdstore.WithShardMapRevision(ctx, 0)
	res, err := s.CompareExchangeAuthority(at0, key, row.StoreVersion, authority.Put([]byte("under 0")))
	require.NoError(t, err)
	require.Equal(t, authority.KindStored, res.Kind)
	row = res.Snapshot

	rev := putShardMap(t, s, 1)
	before := fx.State()
	requireMoved := func(err error) {
		t.Helper()
		require.ErrorIs(t, err, etcdstore.ErrShardMapChanged)
		require.ErrorIs(t, err, authority.ErrUnavailable)
		require.ErrorContains(t, err, fmt.Sprintf("revision %d, not 0", rev))
	}
	_, err = s.CompareExchangeAuthority(at0, key, row.StoreVersion, authority.Put([]byte("stale")))
	requireMoved(err)
	_, err = s.ReadAuthority(at0, key)
	requireMoved(err)
	_, err = s.Reserve(at0, fx.ReserveRequest(authority.ObjectActor, "new-under-stale-map", conformance.TargetA))
	requireMoved(err)
	_, _, err = s.ListPageAt(at0, "", "", 0, 10)
	requireMoved(err)
	_, err = s.RemoveAllByOwner(at0, conformance.OwnerA)
	requireMoved(err)
	fx.RequireState(before)

	atRev := etcdstore.WithShardMapRevision(ctx, rev)
	read, err := s.ReadAuthority(atRev, key)
	require.NoError(t, err)
	require.Equal(t, row.StoreVersion, read.Snapshot.StoreVersion)
	res, err = s.CompareExchangeAuthority(atRev, key, row.StoreVersion, authority.Put([]byte("under rev")))
	require.NoError(t, err)
	require.Equal(t, authority.KindStored, res.Kind)
	applied := res.Snapshot
	// a conflict under the right map is a conflict, not a map change
	res, err = s.CompareExchangeAuthority(atRev, key, row.StoreVersion, authority.Put([]byte("late")))
	require.NoError(t, err)
	require.Equal(t, authority.KindConflict, res.Kind)
	// unfenced: a context without a revision
	res, err = s.CompareExchangeAuthority(ctx, key, applied.StoreVersion, authority.Put([]byte("unfenced")))
	require.NoError(t, err)
	require.Equal(t, authority.KindStored, res.Kind)

	plain := newStore(t, nil, etcdstore.Config{Clock: clock})
	pfx := conformance.NewFixture(t, harnessFor(plain, clock))
	prow := pfx.Active(authority.ObjectUserSpot, "plain", conformance.TargetA)
	res, err = plain.CompareExchangeAuthority(at0, pfx.Key(authority.ObjectUserSpot, "plain"), prow.StoreVersion, authority.Put([]byte("x")))
	require.NoError(t, err)
	require.Equal(t, authority.KindStored, res.Kind, "a single-cluster store ignores a context's map revision")
}

// TestSingleClusterStoreStopsWhenItsMapMoves: a single-cluster writing
// store (neither ShardMapFence nor ShardMember) fences its writes and row
// reads on the shard map key as New read it, so when a resharding freezes
// or switches its cluster (the key moves) every write, batched or not, and
// every row read and listing fails with ErrShardedNamespace and ErrUnavailable, having
// written nothing. A store opened on the moved map (one shard) works, and
// so does a read-only one.
func TestSingleClusterStoreStopsWhenItsMapMoves(t *testing.T) {
	ctx := context.Background()
	clock := authority.NewManualClock(testEpoch)
	plain := newStore(t, nil, etcdstore.Config{Clock: clock})
	fx := conformance.NewFixture(t, harnessFor(plain, clock))
	key := fx.Key(authority.ObjectUserSpot, "plain")
	row := fx.Active(authority.ObjectUserSpot, "plain", conformance.TargetA)
	putShardMap(t, plain, 1) // what a freeze or a switch does to the key

	stopped := func(err error, what string) {
		t.Helper()
		require.ErrorIs(t, err, etcdstore.ErrShardedNamespace, what)
		require.ErrorIs(t, err, authority.ErrUnavailable, what)
		require.ErrorContains(t, err, plain.Namespace(), what)
	}
	_, err := plain.CompareExchangeAuthority(ctx, key, row.StoreVersion, authority.Put([]byte("lost")))
	stopped(err, "a write")
	_, err = plain.Reserve(ctx, fx.ReserveRequest(authority.ObjectActor, "lost", conformance.TargetA))
	stopped(err, "a reservation (group commit)")
	_, err = plain.ReadAuthority(ctx, key)
	stopped(err, "a row read")
	_, err = plain.ListAuthorities(ctx, "", "", 10)
	stopped(err, "a listing's first page")

	after := newStore(t, nil, etcdstore.Config{Clock: clock, Namespace: plain.Namespace()})
	got, err := after.ReadAuthority(ctx, key)
	require.NoError(t, err)
	require.Equal(t, row.StoreVersion, got.Snapshot.StoreVersion, "nothing written")
	res, err := after.Reserve(ctx, fx.ReserveRequest(authority.ObjectActor, "lost", conformance.TargetA))
	require.NoError(t, err)
	require.Equal(t, authority.KindReserved, res.Kind, "the reservation was not written: it is new to a store on the moved map")
	ro, err := etcdstore.New(ctx, etcdstore.Config{Client: shared, Namespace: plain.Namespace(), ReadOnly: true})
	require.NoError(t, err)
	defer func() { _ = ro.Close() }()
	_, err = ro.ReadAuthority(ctx, key)
	require.NoError(t, err)
}

// TestShardMapFenceBatchedWrites: with one Txn slot, concurrent writes are
// merged; those routed under a stale map revision fail with
// ErrShardMapChanged and write nothing, those routed under the current one
// apply, whichever batch they share.
func TestShardMapFenceBatchedWrites(t *testing.T) {
	ctx := context.Background()
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, nil, etcdstore.Config{Clock: clock, ShardMapFence: true, MaxConcurrentTxns: 1})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	const n = 24
	rows := make([]*authority.Snapshot, n)
	keys := make([]authority.Key, n)
	for i := range n {
		id := fmt.Sprintf("batched-%d", i)
		keys[i], rows[i] = fx.Key(authority.ObjectUserSpot, id), fx.Active(authority.ObjectUserSpot, id, conformance.TargetA)
	}
	rev := putShardMap(t, s, 1)
	for round := 0; ; round++ {
		var wg sync.WaitGroup
		errs := make([]error, n)
		results := make([]authority.CompareExchangeResult, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				fence := rev
				if i%2 == 1 {
					fence = 0 // stale
				}
				results[i], errs[i] = s.CompareExchangeAuthority(etcdstore.WithShardMapRevision(ctx, fence), keys[i], rows[i].StoreVersion,
					authority.Put([]byte(fmt.Sprintf("round %d", round))))
			}()
		}
		wg.Wait()
		for i := range n {
			if i%2 == 1 {
				require.ErrorIs(t, errs[i], etcdstore.ErrShardMapChanged, "row %d", i)
				require.Equal(t, rows[i].StoreVersion, fx.MustRow(keys[i]).StoreVersion, "row %d written under a stale map", i)
				continue
			}
			require.NoError(t, errs[i])
			require.Equal(t, authority.KindStored, results[i].Kind)
			rows[i] = results[i].Snapshot
		}
		if s.WriteStats().Batches > 0 || round >= 200 {
			require.Positive(t, s.WriteStats().Batches, "no batch merged writes in %d rounds", round)
			return
		}
	}
}

// TestShardMapFenceGroupCommit: under a capacity policy, reservations on
// one node are group-committed in one Txn; one routed under a stale map
// revision fails the Txn for the map (never written), and the others are
// written once routed again.
func TestShardMapFenceGroupCommit(t *testing.T) {
	ctx := context.Background()
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, nil, etcdstore.Config{Clock: clock, ShardMapFence: true,
		CapacityPolicy: admitAll{}})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	fx.SetLive(conformance.TargetA, true)
	rev := putShardMap(t, s, 1)
	const n = 16
	var wg sync.WaitGroup
	errs := make([]error, n)
	reqs := make([]authority.ReserveRequest, n)
	for i := range n {
		reqs[i] = fx.ReserveRequest(authority.ObjectActor, fmt.Sprintf("grouped-%d", i), conformance.TargetA)
		wg.Add(1)
		go func() {
			defer wg.Done()
			fence := rev
			if i%4 == 0 {
				fence = 0
			}
			for {
				_, errs[i] = s.Reserve(etcdstore.WithShardMapRevision(ctx, fence), reqs[i])
				if errs[i] == nil || fence == 0 {
					return
				}
				require.ErrorIs(t, errs[i], etcdstore.ErrShardMapChanged) // a stale waiter failed its batch
				time.Sleep(time.Millisecond)
			}
		}()
	}
	wg.Wait()
	for i := range n {
		key, err := reqs[i].Key.Encode()
		require.NoError(t, err)
		if i%4 == 0 {
			require.ErrorIs(t, errs[i], authority.ErrUnavailable)
			fx.RequireMissing(key)
			continue
		}
		require.NoError(t, errs[i])
		require.Equal(t, authority.KindSnapshot, fx.Read(key).Kind)
	}
}

// admitAll is a capacity policy that admits every placement (so that
// reservations are group-committed).
type admitAll struct{}

func (admitAll) PlacementCapacityAvailable(authority.NodeDescriptor, authority.CapacityVector, authority.CapacityVector, authority.CapacityVector) bool {
	return true
}

// TestShardedNamespaceRefusesAPlainStore: a store without the map fence
// (a single-cluster store) refuses to open on the namespace of a shard of
// several, or on one a resharding moves rows out of (ErrShardedNamespace,
// naming it); a read-only store and a fenced one open.
func TestShardedNamespaceRefusesAPlainStore(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name string
		key  func(l schema.Layout) string
		val  string
	}{
		{"several shards", schema.Layout.ShardMap, schema.ShardMap{Epoch: 2, Hash: "h", Shards: []schema.ShardMapShard{
			{ClusterID: "a", Namespace: "/a/"}, {ClusterID: "b", Namespace: "/b/"}}}.Encode()},
		{"a move pending", schema.Layout.ShardMovePending, schema.ShardMove{Job: "j",
			From: schema.ShardMap{Epoch: 1, Hash: "h", Shards: []schema.ShardMapShard{{ClusterID: "a", Namespace: "/a/"}}},
			To:   schema.ShardMap{Epoch: 2, Hash: "h", HomeShards: 1, Raw: true, Shards: []schema.ShardMapShard{{ClusterID: "a", Namespace: "/a/"}, {ClusterID: "b", Namespace: "/b/"}}}}.Encode()},
	} {
		t.Run(c.name, func(t *testing.T) {
			first := newStore(t, nil, etcdstore.Config{ShardMapFence: true})
			ns := first.Namespace()
			_, err := shared.Put(ctx, c.key(schema.NewLayout(ns)), c.val)
			require.NoError(t, err)
			_, err = etcdstore.New(ctx, etcdstore.Config{Client: shared, Namespace: ns})
			require.ErrorIs(t, err, etcdstore.ErrShardedNamespace)
			require.ErrorContains(t, err, ns)
			for _, cfg := range []etcdstore.Config{{Client: shared, Namespace: ns, ReadOnly: true}, {Client: shared, Namespace: ns, ShardMapFence: true}} {
				s, err := etcdstore.New(ctx, cfg)
				require.NoError(t, err)
				require.NoError(t, s.Close())
			}
		})
	}
}
