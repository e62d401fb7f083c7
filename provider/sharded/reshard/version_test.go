package reshard_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/etcd/storeversion"
	"github.com/zlink-systems/authority/provider/sharded/reshard"
)

// TestGrowRefusesANamespaceBeforeRowMoves: a source not finalized to
// RowMoves (a process of an earlier build, which does not fence its writes
// on the shard map, may write there past the switch) or a new cluster not
// finalized to it (rows copied there could not be read by every process)
// is refused with ErrVersionSkew before the move writes anything: no
// pending move in any cluster.
func TestGrowRefusesANamespaceBeforeRowMoves(t *testing.T) {
	for _, c := range []struct {
		name  string
		older int // the cluster left at FewerKeys
		says  string
	}{{"source", 0, "Shard 0's namespace"}, {"new cluster", 1, "The new cluster's namespace"}} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			cs := clusters(t)
			_, err := cs[c.older].Client.Put(ctx, schema.NewLayout(cs[c.older].Namespace).ActiveVersion(), schema.EncodeActiveVersion(storeversion.FewerKeys))
			require.NoError(t, err)
			openStore(t, cs, 1, 1, nil)
			_, err = reshard.Run(ctx, reshard.Config{Shards: cs[:1], Add: cs[1], LeaseWait: time.Second, AggregateWait: time.Second})
			require.ErrorIs(t, err, etcdstore.ErrVersionSkew)
			require.ErrorIs(t, err, authority.ErrInvalidArgument)
			require.ErrorContains(t, err, c.says)
			for i := range 2 {
				resp, err := cs[i].Client.Get(ctx, schema.NewLayout(cs[i].Namespace).ShardMovePending())
				require.NoError(t, err)
				require.Empty(t, resp.Kvs, "no pending move written in cluster %d", i)
			}
		})
	}
}
