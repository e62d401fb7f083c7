package sharded_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/zlink-systems/authority/fencing"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/etcd/storeversion"
	"github.com/zlink-systems/authority/provider/sharded"
)

// TestFinalizeMovesEveryShard: shards at Base announce the store in each;
// a dry Finalize moves none, Finalize moves every shard to the target, and
// the store follows each shard's version.
func TestFinalizeMovesEveryShard(t *testing.T) {
	ctx := context.Background()
	shards := shardConfigs(t, clusterCount)
	for _, sc := range shards {
		_, err := sc.Client.Put(ctx, schema.NewLayout(sc.Namespace).ActiveVersion(), schema.EncodeActiveVersion(storeversion.Base))
		require.NoError(t, err)
	}
	s := newStore(t, 0, sharded.Config{Shards: shards})
	require.Equal(t, storeversion.Base, s.ActiveVersion())
	statuses, err := s.UpgradeStatus(ctx)
	require.NoError(t, err)
	require.Len(t, statuses, clusterCount)
	for i, st := range statuses {
		require.Equal(t, storeversion.Base, st.Active, "shard %d", i)
		require.NotEmpty(t, st.Announced, "shard %d has no announcement of the store", i)
	}
	dry, err := s.Finalize(ctx, storeversion.Latest, true)
	require.NoError(t, err)
	for i, r := range dry {
		require.False(t, r.Moved, "shard %d moved on a dry run", i)
	}
	require.Equal(t, storeversion.Base, s.ActiveVersion())
	done, err := s.Finalize(ctx, storeversion.Latest, false)
	require.NoError(t, err)
	for i, r := range done {
		require.True(t, r.Moved, "shard %d", i)
		require.Equal(t, storeversion.Latest, r.To)
	}
	require.Eventually(t, func() bool { return s.ActiveVersion() == storeversion.Latest }, time.Minute, 10*time.Millisecond)
}

// TestClusterIDNamesTheShardSet: over several shards from the start
// ClusterID names the shard set, as the release before resharding named it
// (a digest of the map: a fence table it bound keeps working), the same
// for every store of one map and another for another map
// (fencing.Guard.ForCluster takes it); over one shard it is the cluster's.
// A growth keeps both (clusterid_internal_test.go, package reshard's
// tests).
func TestClusterIDNamesTheShardSet(t *testing.T) {
	ctx := context.Background()
	shards := shardConfigs(t, clusterCount)
	a := newStore(t, 0, sharded.Config{Shards: shards})
	b := newStore(t, 0, sharded.Config{Shards: shards})
	other := newStore(t, clusterCount, sharded.Config{})
	idA, err := a.ClusterID(ctx)
	require.NoError(t, err)
	idB, err := b.ClusterID(ctx)
	require.NoError(t, err)
	idOther, err := other.ClusterID(ctx)
	require.NoError(t, err)
	require.Equal(t, idA, idB)
	require.NotEqual(t, idA, idOther)
	sum := sha256.Sum256([]byte(a.Map().Encode()))
	require.Equal(t, "shards:"+hex.EncodeToString(sum[:16]), idA, "the earlier release's ID of this map")
	g, err := fencing.NewGuard(fencing.PostgreSQL, "authority_fence")
	require.NoError(t, err)
	_, err = g.ForCluster(idA)
	require.NoError(t, err, "a fence table can bind to the shard set")
	one := newStore(t, 1, sharded.Config{})
	idOne, err := one.ClusterID(ctx)
	require.NoError(t, err)
	want, err := one.Shard(0).ClusterID(ctx)
	require.NoError(t, err)
	require.Equal(t, want, idOne)
}
