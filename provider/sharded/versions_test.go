package sharded_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

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
