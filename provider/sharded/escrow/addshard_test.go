package escrow_test

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/sharded/escrow"
)

// TestAddShard: a mover grows by the next index only; adding the same
// shard again (a retry, or racing callers) changes nothing, another shard
// at a taken index is refused, and homes stay where Config.Home puts them.
func TestAddShard(t *testing.T) {
	m, err := escrow.New(escrow.Config{Shards: 2, Home: func(n authority.NodeDescriptor) int { return escrow.HomeShard(n, 2) }})
	require.NoError(t, err)
	sh := etcdstore.BudgetSteps{}
	require.ErrorIs(t, m.AddShard(3, sh), authority.ErrInvalidArgument, "not the next index")
	require.ErrorIs(t, m.AddShard(2, nil), authority.ErrInvalidArgument)
	require.ErrorIs(t, m.AddShard(-1, sh), authority.ErrInvalidArgument)
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() { errs[i] = m.AddShard(2, sh) })
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, 3, m.Shards())
	require.ErrorIs(t, m.Attach(3, sh), authority.ErrInvalidArgument)
	require.NoError(t, m.Attach(0, sh))
}
