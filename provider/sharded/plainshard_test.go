package sharded_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/sharded"
)

// TestPlainStoreRefusesAShardOfSeveral: a namespace that is one shard of a
// store over three clusters does not open as a plain writing store (its
// writes would skip the map's routing, the escrow and the row locks): New
// fails with ErrShardedNamespace and ErrInvalidArgument naming the
// namespace, the epoch and the shard count, and writes nothing (no
// announcement, no version key). A read-only store and a shard member open.
func TestPlainStoreRefusesAShardOfSeveral(t *testing.T) {
	ctx := context.Background()
	shards := shardConfigs(t, clusterCount)
	s, err := sharded.New(ctx, sharded.Config{Shards: shards})
	require.NoError(t, err)
	require.NoError(t, s.Close()) // its announcements go: the namespace stays as it is
	sc := shards[1]
	before := namespaceKeys(t, sc)
	require.NotEmpty(t, before)

	plain, err := etcdstore.New(ctx, sc)
	if plain != nil {
		_ = plain.Close()
	}
	require.ErrorIs(t, err, etcdstore.ErrShardedNamespace)
	require.ErrorIs(t, err, authority.ErrInvalidArgument)
	require.ErrorContains(t, err, "namespace "+sc.Namespace+" is one shard of a store over 3 etcd clusters (shard map epoch 1)")
	require.ErrorContains(t, err, "open it with provider/sharded")
	require.Equal(t, before, namespaceKeys(t, sc), "the refused New wrote in the namespace")

	ro := sc
	ro.ReadOnly = true
	reader, err := etcdstore.New(ctx, ro)
	require.NoError(t, err, "a read-only store opens")
	st, err := reader.ReadShardMap(ctx)
	require.NoError(t, err)
	require.Len(t, st.Map.Shards, clusterCount)
	require.NoError(t, reader.Close())

	member := sc
	member.ShardMember = true
	m, err := etcdstore.New(ctx, member)
	require.NoError(t, err, "a shard member opens")
	require.NoError(t, m.Close())
}

// TestPlainStoreOpensAOneShardNamespace: a store of one shard writes no
// map, so its namespace still opens as a plain writing store, which writes
// rows the sharded store reads.
func TestPlainStoreOpensAOneShardNamespace(t *testing.T) {
	ctx := context.Background()
	sc := shardConfigs(t, 1)[0]
	s := newStore(t, 0, sharded.Config{Shards: []etcdstore.Config{sc}})
	plain, err := etcdstore.New(ctx, sc)
	require.NoError(t, err)
	defer plain.Close()
	pfx := conformance.NewFixture(t, plainHarness(plain))
	put := pfx.Active(authority.ObjectActor, "a", conformance.TargetA)
	sfx := conformance.NewFixture(t, harnessFor(s, nil))
	conformance.RequireSameRow(t, put, sfx.MustRow(pfx.Key(authority.ObjectActor, "a")))
	m, _ := storedMap(t, sc)
	require.Nil(t, m)
}

// namespaceKeys returns every key of sc's namespace with its ModRevision.
func namespaceKeys(t testing.TB, sc etcdstore.Config) map[string]string {
	t.Helper()
	resp, err := sc.Client.Get(context.Background(), sc.Namespace, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	require.NoError(t, err)
	out := make(map[string]string, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		out[string(kv.Key)] = fmt.Sprint(kv.ModRevision)
	}
	return out
}
