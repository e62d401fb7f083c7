package sharded_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/sharded"
)

// beginMove puts a pending move of cs[0]'s one-shard namespace onto cs[1]
// in cs[0], as a resharding's first step does.
func beginMove(t *testing.T, cs []etcdstore.Config) {
	t.Helper()
	ctx := t.Context()
	var ids []schema.ShardMapShard
	var src *etcdstore.Store
	for i, c := range cs {
		st, err := etcdstore.New(ctx, etcdstore.Config{Client: c.Client, Namespace: c.Namespace, ShardMapFence: true})
		require.NoError(t, err)
		defer func() { _ = st.Close() }()
		id, err := st.ClusterID(ctx)
		require.NoError(t, err)
		ids = append(ids, schema.ShardMapShard{ClusterID: id, Namespace: st.Namespace()})
		if i == 0 {
			src = st
		}
	}
	from := schema.ShardMap{Epoch: 1, Hash: sharded.HashName, Shards: ids[:1]}
	mv := schema.ShardMove{Job: "attack", From: from, To: schema.ShardMap{Epoch: 2, Hash: sharded.HashName, Shards: ids, HomeShards: from.NextHomes(), Raw: from.NextRaw()}}
	k, err := src.Moves().ReadMap(ctx)
	require.NoError(t, err)
	ok, _, err := src.Moves().Begin(ctx, mv, k, false)
	require.NoError(t, err)
	require.True(t, ok)
}

// TestSpareOpenedByAFailedReloadIsKept: a store over one shard with Spares
// whose map reload opened the spare a pending move names and then failed
// (its context ended at the next read) reads the map again: the spare it
// opened is among its stores. (It was skipped as opened and the reload
// refused "neither among the store's shards nor among Config.Spares",
// every time: the store could never follow the move.)
func TestSpareOpenedByAFailedReloadIsKept(t *testing.T) {
	ctx := context.Background()
	cs := shardConfigs(t, 2)
	s := newStore(t, 1, sharded.Config{Shards: cs[:1], Spares: cs[1:2]})
	n, err := s.OpenSparesThenFail(ctx, func() { beginMove(t, cs) })
	require.NoError(t, err)
	require.Equal(t, 1, n, "the failed reload opened the spare")
	require.NoError(t, s.ReloadMap(ctx), "the spare a failed reload opened is known")
	require.NoError(t, s.ReloadMap(ctx))
	require.NoError(t, s.Close())
}
