package sharded_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/sharded"
	"github.com/zlink-systems/authority/provider/sharded/escrow"
)

// storedMap reads the raw shard-map key of a shard's namespace (nil:
// absent) with its ModRevision.
func storedMap(t testing.TB, sc etcdstore.Config) (*schema.ShardMap, int64) {
	t.Helper()
	resp, err := sc.Client.Get(context.Background(), schema.NewLayout(sc.Namespace).ShardMap())
	require.NoError(t, err)
	if len(resp.Kvs) == 0 {
		return nil, 0
	}
	m, err := schema.DecodeShardMap(resp.Kvs[0])
	require.NoError(t, err)
	return &m, resp.Kvs[0].ModRevision
}

// TestShardMapIsStoredInEveryShard: New over fresh namespaces writes one
// map, the configured one, in every shard; a second store of the same
// configuration opens on it and writes nothing.
func TestShardMapIsStoredInEveryShard(t *testing.T) {
	shards := shardConfigs(t, clusterCount)
	s := newStore(t, 0, sharded.Config{Shards: shards})
	want := s.Map()
	require.Equal(t, int64(1), want.Epoch)
	require.Equal(t, sharded.HashName, want.Hash)
	revs := make([]int64, len(shards))
	for i, sc := range shards {
		m, rev := storedMap(t, sc)
		require.NotNil(t, m, "shard %d has no map", i)
		require.Equal(t, want, *m)
		require.Equal(t, sc.Namespace, m.Shards[i].Namespace)
		revs[i] = rev
	}
	again := newStore(t, 0, sharded.Config{Shards: shards})
	require.Equal(t, want, again.Map())
	for i, sc := range shards {
		_, rev := storedMap(t, sc)
		require.Equal(t, revs[i], rev, "shard %d's map was written again", i)
	}
}

// TestShardMapMismatchRefusesToOpen: a store configured with another map
// than the stored one (another order, fewer or more shards, another epoch)
// is refused with ErrShardMapMismatch naming the shard and the difference,
// and the stored maps are unchanged.
func TestShardMapMismatchRefusesToOpen(t *testing.T) {
	shards := shardConfigs(t, clusterCount)
	newStore(t, 0, sharded.Config{Shards: shards})
	extra := shardConfigs(t, 1)[0]
	_, extraRev := storedMap(t, extra)
	cases := []struct {
		name   string
		cfg    sharded.Config
		naming string
	}{
		{"order", sharded.Config{Shards: []etcdstore.Config{shards[1], shards[0], shards[2]}}, "shard 0 is cluster"},
		{"fewer", sharded.Config{Shards: shards[:2]}, "stored map has 3 shards"},
		{"more", sharded.Config{Shards: append(append([]etcdstore.Config(nil), shards...), extra)}, "stored map has 3 shards"},
		{"epoch", sharded.Config{Shards: shards, Epoch: 2}, "stored epoch 1, configured 2"},
		{"one", sharded.Config{Shards: shards[2:]}, "stored map has 3 shards"},
	}
	revs := make([]int64, len(shards))
	for i, sc := range shards {
		_, revs[i] = storedMap(t, sc)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, err := sharded.New(context.Background(), tc.cfg)
			if s != nil {
				_ = s.Close()
			}
			require.ErrorIs(t, err, sharded.ErrShardMapMismatch)
			require.ErrorContains(t, err, tc.naming)
			for i, sc := range shards {
				_, rev := storedMap(t, sc)
				require.Equal(t, revs[i], rev, "shard %d's map changed", i)
			}
			m, rev := storedMap(t, extra)
			require.Nil(t, m, "a map was written in the shard the stored map does not list")
			require.Equal(t, extraRev, rev)
		})
	}
}

// TestShardMapIsNotWrittenOverRows: a namespace a single-cluster store
// wrote rows to cannot be a shard of a map of several shards (its rows
// would be in the wrong shard): New refuses, and writes no map anywhere.
func TestShardMapIsNotWrittenOverRows(t *testing.T) {
	shards := shardConfigs(t, clusterCount)
	plain, err := etcdstore.New(context.Background(), shards[1])
	require.NoError(t, err)
	defer plain.Close()
	fx := conformance.NewFixture(t, plainHarness(plain))
	fx.Active(authority.ObjectActor, "placed-by-one-cluster", conformance.TargetA)
	s, err := sharded.New(context.Background(), sharded.Config{Shards: shards})
	if s != nil {
		_ = s.Close()
	}
	require.ErrorIs(t, err, sharded.ErrShardMapMismatch)
	require.ErrorContains(t, err, "shard 1: its namespace holds rows but no shard map")
	for i, sc := range shards {
		m, _ := storedMap(t, sc)
		require.Nil(t, m, "shard %d got a map", i)
	}
}

// TestReadOnlyStoreNeedsAStoredMap: a read-only store of several shards
// creates no map: over namespaces without one it refuses, writing nothing.
func TestReadOnlyStoreNeedsAStoredMap(t *testing.T) {
	shards := shardConfigs(t, clusterCount)
	s, err := sharded.New(context.Background(), sharded.Config{Shards: shards, ReadOnly: true})
	if s != nil {
		_ = s.Close()
	}
	require.ErrorIs(t, err, sharded.ErrShardMapMismatch)
	require.ErrorContains(t, err, "no shard map stored")
	for i, sc := range shards {
		resp, err := sc.Client.Get(context.Background(), sc.Namespace, clientv3.WithPrefix(), clientv3.WithCountOnly())
		require.NoError(t, err)
		require.Zero(t, resp.Count, "shard %d's namespace was written", i)
	}
	newStore(t, 0, sharded.Config{Shards: shards})
	ro := newStore(t, 0, sharded.Config{Shards: shards, ReadOnly: true})
	require.Equal(t, clusterCount, ro.Shards())
}

// TestConcurrentOpensAgreeOnOneMap: stores racing to create the map of the
// same shards with different epochs: the create is fenced, so every shard
// ends with one map, the stores that opened all have it, and the others
// were refused with ErrShardMapMismatch.
func TestConcurrentOpensAgreeOnOneMap(t *testing.T) {
	shards := shardConfigs(t, clusterCount)
	const racers = 6
	stores := make([]*sharded.Store, racers)
	errs := make([]error, racers)
	var wg sync.WaitGroup
	for i := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stores[i], errs[i] = sharded.New(context.Background(), sharded.Config{Shards: shards, Epoch: int64(1 + i%2)})
		}()
	}
	wg.Wait()
	var opened []schema.ShardMap
	for i := range racers {
		if errs[i] != nil {
			require.ErrorIs(t, errs[i], sharded.ErrShardMapMismatch)
			continue
		}
		opened = append(opened, stores[i].Map())
		require.NoError(t, stores[i].Close())
	}
	require.NotEmpty(t, opened)
	first, _ := storedMap(t, shards[0])
	require.NotNil(t, first)
	for _, m := range opened {
		require.Equal(t, *first, m)
	}
	for i, sc := range shards {
		m, _ := storedMap(t, sc)
		require.Equal(t, first, m, "shard %d holds another map", i)
	}
}

// TestConfigurationRefusals: what New refuses before anything is opened,
// each ErrInvalidArgument naming its cause.
func TestConfigurationRefusals(t *testing.T) {
	shards := shardConfigs(t, 2)
	withClock := append([]etcdstore.Config(nil), shards...)
	withClock[1].Clock = authority.SystemClock{}
	withEscrow := append([]etcdstore.Config(nil), shards...)
	m, err := escrow.New(escrow.Config{Shards: 2})
	require.NoError(t, err)
	withEscrow[0].CapacityEscrow = m.Hook(0)
	cases := []struct {
		name   string
		cfg    sharded.Config
		naming string
	}{
		{"no shards", sharded.Config{}, "needs 1 to 256 shards"},
		{"shard setting", sharded.Config{Shards: withClock}, "Shard 1 sets Clock"},
		{"negative epoch", sharded.Config{Shards: shards, Epoch: -1}, "epoch -1"},
		{"one cluster twice", sharded.Config{Shards: []etcdstore.Config{shards[0], shards[0]}}, "both cluster"},
		{"shard escrow", sharded.Config{Shards: withEscrow}, "Shard 0 sets CapacityEscrow"},
		{"negative escrow chunk", sharded.Config{Shards: shards, EscrowChunk: -1}, "EscrowChunk -1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, err := sharded.New(context.Background(), tc.cfg)
			if s != nil {
				_ = s.Close()
			}
			require.ErrorIs(t, err, authority.ErrInvalidArgument)
			require.ErrorContains(t, err, tc.naming)
		})
	}
}

// plainHarness is a conformance harness over a single-cluster store (no
// clock control), for fixtures that write through it.
func plainHarness(s *etcdstore.Store) *conformance.Harness {
	return &conformance.Harness{
		Store: s,
		SetLive: func(t testing.TB, node authority.NodeDescriptor, lifecycle int64, owner authority.OwnerToken, live bool) {
			t.Helper()
			var err error
			if live {
				err = s.MarkLive(context.Background(), node, lifecycle, owner, liveTTL)
			} else {
				err = s.MarkDead(context.Background(), node, lifecycle, owner)
			}
			require.NoError(t, err)
		},
		Now:        authority.SystemClock{}.Now,
		Relocation: s.Relocation(),
	}
}
