package sharded

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/zlink-systems/authority/provider/etcd/schema"
)

// TestClusterIDOfACreatedMapSurvivesGrowth: a namespace created with
// several shards keeps the ClusterID the release before resharding gave it
// (a digest of its map), through growths; one that grew from a single
// cluster has none (shard 0's cluster ID stands).
func TestClusterIDOfACreatedMapSurvivesGrowth(t *testing.T) {
	shards := []schema.ShardMapShard{{ClusterID: "a", Namespace: "/n/"}, {ClusterID: "b", Namespace: "/n/"}, {ClusterID: "c", Namespace: "/n/"}}
	created := schema.ShardMap{Epoch: 1, Hash: HashName, Shards: shards[:2]}
	// the earlier release's formula, on the map as it stored it
	sum := sha256.Sum256([]byte(created.Encode()))
	want := "shards:" + hex.EncodeToString(sum[:16])

	id, ok := createdMapID(created)
	require.True(t, ok)
	require.Equal(t, want, id)
	grown := schema.ShardMap{Epoch: 2, Hash: HashName, Shards: shards, HomeShards: created.NextHomes(), Raw: created.NextRaw()}
	id, ok = createdMapID(grown)
	require.True(t, ok)
	require.Equal(t, want, id, "a growth keeps the ID")

	one := schema.ShardMap{Epoch: 1, Hash: HashName, Shards: shards[:1]}
	_, ok = createdMapID(one)
	require.False(t, ok)
	fromOne := schema.ShardMap{Epoch: 3, Hash: HashName, Shards: shards, HomeShards: 1, Raw: true}
	_, ok = createdMapID(fromOne)
	require.False(t, ok, "grown from one cluster: shard 0's cluster ID")
}
