package etcd_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
)

func shardMapOf(ns string) schema.ShardMap {
	return schema.ShardMap{Epoch: 1, Hash: "test-hash", Shards: []schema.ShardMapShard{{ClusterID: "c1", Namespace: ns}, {ClusterID: "c2", Namespace: ns}}}
}

// TestCreateShardMapIsFenced: the map is created once, only in a namespace
// without a map and without rows; otherwise nothing is written and the
// state says why. A read-only store refuses to write it.
func TestCreateShardMapIsFenced(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, nil, etcdstore.Config{})
	st, err := s.ReadShardMap(ctx)
	require.NoError(t, err)
	require.False(t, st.Found)
	m := shardMapOf(s.Namespace())
	created, st, err := s.CreateShardMap(ctx, m)
	require.NoError(t, err)
	require.True(t, created)
	other := m
	other.Epoch = 2
	created, st, err = s.CreateShardMap(ctx, other)
	require.NoError(t, err)
	require.False(t, created)
	require.True(t, st.Found)
	require.Equal(t, m, st.Map, "the map first created stays")
	read, err := s.ReadShardMap(ctx)
	require.NoError(t, err)
	require.Equal(t, m, read.Map)

	clock := authority.NewManualClock(testEpoch)
	withRows := newStore(t, nil, etcdstore.Config{Clock: clock})
	fx := conformance.NewFixture(t, harnessFor(withRows, clock))
	fx.Active(authority.ObjectActor, "row", conformance.TargetA)
	created, st, err = withRows.CreateShardMap(ctx, shardMapOf(withRows.Namespace()))
	require.NoError(t, err)
	require.False(t, created)
	require.False(t, st.Found)
	require.True(t, st.HasRows)
	resp, err := shared.Get(ctx, schema.NewLayout(withRows.Namespace()).ShardMap())
	require.NoError(t, err)
	require.Empty(t, resp.Kvs)

	_, _, err = s.CreateShardMap(ctx, schema.ShardMap{Epoch: 0, Hash: "h", Shards: m.Shards})
	require.Error(t, err, "an unstorable map is refused")
	ns := etcdtest.Namespace()
	ro := newStore(t, nil, etcdstore.Config{Namespace: ns, ReadOnly: true})
	_, _, err = ro.CreateShardMap(ctx, shardMapOf(ns))
	require.ErrorIs(t, err, etcdstore.ErrReadOnly)
	resp, err = shared.Get(ctx, ns, clientv3WithPrefix()...)
	require.NoError(t, err)
	require.Empty(t, resp.Kvs)
}

// TestAcquireGeneration: a generation above the namespace's last one is
// granted as asked (the owner generation key moves to it); one at or below
// it is ErrGenerationTaken, nothing written; a generation out of range is
// ErrInvalidArgument.
func TestAcquireGeneration(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, nil, etcdstore.Config{})
	node := conformance.NodeA
	l, err := s.Registry().AcquireGeneration(ctx, node, 1, authority.OwnerToken{OwnerID: "o", LeaseGeneration: 5}, 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, int64(5), l.Token().LeaseGeneration)
	live, err := s.IsTargetLive(ctx, node, 1, l.Token())
	require.NoError(t, err)
	require.True(t, live)
	genKey := schema.NewLayout(s.Namespace()).OwnerGen("o")
	before, err := shared.Get(ctx, genKey)
	require.NoError(t, err)
	require.Equal(t, "5", string(before.Kvs[0].Value))
	for _, gen := range []int64{5, 3} {
		_, err = s.Registry().AcquireGeneration(ctx, node, 1, authority.OwnerToken{OwnerID: "o", LeaseGeneration: gen}, 10*time.Second)
		require.ErrorIs(t, err, etcdstore.ErrGenerationTaken, "generation %d", gen)
		require.ErrorIs(t, err, etcdstore.ErrLeaseLost)
		live, err := s.IsTargetLive(ctx, node, 1, authority.OwnerToken{OwnerID: "o", LeaseGeneration: 3})
		require.NoError(t, err)
		require.False(t, live)
	}
	after, err := shared.Get(ctx, genKey)
	require.NoError(t, err)
	require.Equal(t, before.Kvs[0].ModRevision, after.Kvs[0].ModRevision, "a refused generation wrote the key")
	next, err := s.Registry().Acquire(ctx, node, 1, "o", 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, int64(6), next.Token().LeaseGeneration, "Acquire goes on from the given generation")
	for _, gen := range []int64{0, -1} {
		_, err = s.Registry().AcquireGeneration(ctx, node, 1, authority.OwnerToken{OwnerID: "o", LeaseGeneration: gen}, 10*time.Second)
		require.ErrorIs(t, err, authority.ErrInvalidArgument)
	}
	require.NoError(t, l.Close(ctx))
	require.NoError(t, next.Close(ctx))
}

// TestListPageAtAndHasAggregate: a page read at a revision holds the rows
// of that revision after the key given, with that revision; a key outside
// the prefix or a negative revision is ErrInvalidArgument. HasAggregate
// finds a prepared record.
func TestListPageAtAndHasAggregate(t *testing.T) {
	ctx := context.Background()
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, nil, etcdstore.Config{Clock: clock})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	for _, id := range []string{"a", "b", "c"} {
		fx.Active(authority.ObjectActor, id, conformance.TargetA)
	}
	page, rev, err := s.ListPageAt(ctx, "actor/", "", 0, 10)
	require.NoError(t, err)
	require.Len(t, page.Items, 3)
	fx.Active(authority.ObjectActor, "d", conformance.TargetA)
	later, at, err := s.ListPageAt(ctx, "actor/", "actor/a", rev, 10)
	require.NoError(t, err)
	require.Equal(t, rev, at)
	require.Len(t, later.Items, 2, "rows after actor/a at the first page's revision")
	for _, bad := range []struct {
		after authority.Key
		rev   int64
	}{{"user_spot/a", 0}, {"actor/a", -1}} {
		_, _, err = s.ListPageAt(ctx, "actor/", bad.after, bad.rev, 10)
		require.ErrorIs(t, err, authority.ErrInvalidArgument)
	}
	a := fx.MustRow(fx.Key(authority.ObjectActor, "a"))
	fence := fx.MustPrepare(conformance.AggregateRequest("agg", 1, conformance.TargetB, authority.CapacityVector{Actors: 1},
		conformance.Participant(fx.Key(authority.ObjectActor, "a"), a.StoreVersion, authority.TransitionNewOwner, []byte("a"))))
	has, err := s.HasAggregate(ctx, fence)
	require.NoError(t, err)
	require.True(t, has)
	has, err = s.HasAggregate(ctx, authority.Fence{AggregateID: "agg", AggregateGeneration: 2})
	require.NoError(t, err)
	require.False(t, has)
}

func clientv3WithPrefix() []clientv3.OpOption { return []clientv3.OpOption{clientv3.WithPrefix()} }

// TestNewRefusesAShardOfSeveral: a writing store opens a namespace without
// a shard map or with a map of one shard, and refuses one whose map lists
// several (ErrShardedNamespace, ErrInvalidArgument) without writing: no
// announcement, no version key. A read-only store or a shard member opens.
func TestNewRefusesAShardOfSeveral(t *testing.T) {
	ctx := context.Background()
	one := etcdtest.Namespace()
	writer := newStore(t, nil, etcdstore.Config{Namespace: one, ShardMember: true})
	m := shardMapOf(one)
	m.Shards = m.Shards[:1]
	created, _, err := writer.CreateShardMap(ctx, m)
	require.NoError(t, err)
	require.True(t, created)
	newStore(t, nil, etcdstore.Config{Namespace: one}) // a map of one shard: opens

	several := etcdtest.Namespace()
	t.Cleanup(func() { _, _ = shared.Delete(ctx, several, clientv3.WithPrefix()) })
	m = shardMapOf(several)
	m.Epoch = 7
	_, err = shared.Put(ctx, schema.NewLayout(several).ShardMap(), m.Encode())
	require.NoError(t, err)
	before, err := shared.Get(ctx, several, clientv3.WithPrefix())
	require.NoError(t, err)
	s, err := etcdstore.New(ctx, etcdstore.Config{Client: shared, Namespace: several})
	if s != nil {
		_ = s.Close()
	}
	require.ErrorIs(t, err, etcdstore.ErrShardedNamespace)
	require.ErrorIs(t, err, authority.ErrInvalidArgument)
	require.ErrorContains(t, err, "namespace "+several+" is one shard of a store over 2 etcd clusters (shard map epoch 7)")
	after, err := shared.Get(ctx, several, clientv3.WithPrefix())
	require.NoError(t, err)
	require.Len(t, after.Kvs, 1, "the refused New wrote in the namespace")
	require.Equal(t, before.Kvs[0].ModRevision, after.Kvs[0].ModRevision)
	newStore(t, nil, etcdstore.Config{Namespace: several, ReadOnly: true})
	newStore(t, nil, etcdstore.Config{Namespace: several, ShardMember: true})

	corrupt := etcdtest.Namespace()
	t.Cleanup(func() { _, _ = shared.Delete(ctx, corrupt, clientv3.WithPrefix()) })
	_, err = shared.Put(ctx, schema.NewLayout(corrupt).ShardMap(), "not a map")
	require.NoError(t, err)
	s, err = etcdstore.New(ctx, etcdstore.Config{Client: shared, Namespace: corrupt})
	if s != nil {
		_ = s.Close()
	}
	require.ErrorIs(t, err, authority.ErrCorrupt, "an undecodable map is not taken for no map")
}
