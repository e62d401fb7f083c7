package schema

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/mvccpb"

	authority "github.com/zlink-systems/authority"
)

// TestShardMapDecodesStrictly: the shard map round-trips through
// DecodeEntry, and a map no store could have written (unknown field, epoch 0,
// no shard, a shard listed twice, a namespace the layout refuses, null) is
// ErrCorrupt naming the key.
func TestShardMapDecodesStrictly(t *testing.T) {
	l := Layout{ns: "/ns/"}
	kv := func(v string) *mvccpb.KeyValue { return &mvccpb.KeyValue{Key: []byte(l.ShardMap()), Value: []byte(v)} }
	e, err := DecodeEntry("/ns/", kv(goldenShardMap().Encode()))
	require.NoError(t, err)
	require.Equal(t, EntryShardMap, e.Kind)
	require.Equal(t, goldenShardMap(), *e.ShardMap)
	for _, bad := range []string{
		`{"e":1,"h":"fnv1a64-jump","s":[{"c":"a","n":"/a/"}],"x":1}`,
		`{"e":0,"h":"fnv1a64-jump","s":[{"c":"a","n":"/a/"}]}`,
		`{"e":1,"h":"","s":[{"c":"a","n":"/a/"}]}`,
		`{"e":1,"h":"fnv1a64-jump","s":[]}`,
		`{"e":1,"h":"fnv1a64-jump","s":null}`,
		`{"e":1,"h":"fnv1a64-jump","s":[{"c":"a","n":"/a/"},{"c":"a","n":"/a/"}]}`,
		`{"e":1,"h":"fnv1a64-jump","s":[{"c":"a","n":"/a/rows/"}]}`,
		`{"e":1,"h":"fnv1a64-jump","s":[{"c":"","n":"/a/"}]}`,
		`null`,
	} {
		_, err := DecodeEntry("/ns/", kv(bad))
		require.ErrorIs(t, err, authority.ErrCorrupt, bad)
		require.ErrorContains(t, err, l.ShardMap(), bad)
	}
	_, err = DecodeEntry("/ns/", &mvccpb.KeyValue{Key: []byte("/ns/shard-map/other"), Value: []byte(goldenShardMap().Encode())})
	require.ErrorIs(t, err, authority.ErrCorrupt, "a key under shard-map/ other than the map")
}

// TestShardMapDiffNamesTheDifference: Diff is empty for equal maps and names
// the hash, the epoch, the shard count or the first shard that differs.
func TestShardMapDiffNamesTheDifference(t *testing.T) {
	m := goldenShardMap()
	require.Empty(t, m.Diff(goldenShardMap()))
	other := goldenShardMap()
	other.Epoch = 2
	require.Contains(t, m.Diff(other), "stored epoch 1, configured 2")
	other = goldenShardMap()
	other.Hash = "other"
	require.Contains(t, m.Diff(other), `stored hash "fnv1a64-jump", configured "other"`)
	other = goldenShardMap()
	other.Shards = other.Shards[:1]
	require.Contains(t, m.Diff(other), "stored map has 2 shards")
	other = goldenShardMap()
	other.Shards[1].Namespace = "/other/"
	require.Contains(t, m.Diff(other), `shard 1 is cluster 8e9e05c52164694d namespace "/zlink/authority/v1/" in the stored map`)
	require.Contains(t, m.Diff(other), `namespace "/other/" configured`)
}
