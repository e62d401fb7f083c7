package twophase_test

import (
	"context"
	"hash/fnv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/etcd/storeversion"
	"github.com/zlink-systems/authority/provider/sharded/twophase"
)

var testEpoch = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// liveTTL is the lease of the liveness keys tests mark live; tests end long
// before it.
const liveTTL = 10 * time.Minute

// roundRobin routes keys and aggregate IDs to shards in the order they are
// first asked for: keys from shard 0 up, aggregates from the last shard
// down, so a fixture's first two keys are in two shards and its first
// aggregate's record in the third.
type roundRobin struct {
	mu      sync.Mutex
	keys    map[authority.Key]int
	aggs    map[string]int
	k, a, n int
}

func newRoundRobin(n int) *roundRobin {
	return &roundRobin{keys: map[authority.Key]int{}, aggs: map[string]int{}, n: n}
}

func (r *roundRobin) ShardOf(key authority.Key) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	i, ok := r.keys[key]
	if !ok {
		i = r.k % r.n
		r.k++
		r.keys[key] = i
	}
	return i
}

func (r *roundRobin) CoordinatorOf(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	i, ok := r.aggs[id]
	if !ok {
		i = r.n - 1 - r.a%r.n
		r.a++
		r.aggs[id] = i
	}
	return i
}

// hashed routes by FNV-1a of the key or ID, as a sharded store's map does.
type hashed struct{ n int }

func (h hashed) ShardOf(key authority.Key) int { return fnvMod(string(key), h.n) }
func (h hashed) CoordinatorOf(id string) int   { return fnvMod("aggregate/"+id, h.n) }

func fnvMod(s string, n int) int {
	f := fnv.New32a()
	_, _ = f.Write([]byte(s))
	return int(f.Sum32() % uint32(n))
}

// oneShard routes everything to shard 0: every aggregate is wholly in its
// coordinator shard.
type oneShard struct{}

func (oneShard) ShardOf(authority.Key) int { return 0 }
func (oneShard) CoordinatorOf(string) int  { return 0 }

// cluster is a test's namespaces, one in each shard's etcd, and what every
// store instance over them shares.
type cluster struct {
	namespaces [shardCount]string
	clock      *authority.ManualClock
	router     twophase.Router
}

func newCluster(t testing.TB, router twophase.Router) *cluster {
	c := &cluster{clock: authority.NewManualClock(testEpoch), router: router}
	for i := range c.namespaces {
		c.namespaces[i] = etcdtest.Namespace()
	}
	t.Cleanup(func() {
		for i, ns := range c.namespaces {
			_, _ = shared[i].Delete(context.Background(), ns, clientv3.WithPrefix())
		}
	})
	return c
}

// instance is one store instance over the shards: a store per shard, each
// on a client of its own, and a coordinator over them.
type instance struct {
	c      *cluster
	stores []*etcdstore.Store
	shards []twophase.Shard
	coord  *twophase.Coordinator
}

// instance opens a new instance; wrap (when not nil) wraps its shards
// before the coordinator gets them.
func (c *cluster) instance(t testing.TB, wrap func([]twophase.Shard) []twophase.Shard) *instance {
	t.Helper()
	in := &instance{c: c}
	for i, ns := range c.namespaces {
		client, err := servers[i].NewClient()
		require.NoError(t, err)
		s, err := etcdstore.New(context.Background(), etcdstore.Config{Client: client, Namespace: ns, Clock: c.clock})
		require.NoError(t, err)
		t.Cleanup(func() {
			_ = s.Close()
			_ = client.Close()
		})
		in.stores = append(in.stores, s)
		in.shards = append(in.shards, twophase.EtcdShard(s))
	}
	shards := in.shards
	if wrap != nil {
		shards = wrap(shards)
	}
	coord, err := twophase.New(shards, c.router)
	require.NoError(t, err)
	in.coord = coord
	return in
}

// storeOf returns the store of key's shard.
func (in *instance) storeOf(key authority.Key) *etcdstore.Store {
	return in.stores[in.c.router.ShardOf(key)]
}

// setLive marks owner live (or dead) on node's lifecycle in every shard.
func (in *instance) setLive(t testing.TB, node authority.NodeDescriptor, lifecycle int64, owner authority.OwnerToken, live bool) {
	t.Helper()
	for _, s := range in.stores {
		var err error
		if live {
			err = s.MarkLive(context.Background(), node, lifecycle, owner, liveTTL)
		} else {
			err = s.MarkDead(context.Background(), node, lifecycle, owner)
		}
		require.NoError(t, err)
	}
}

// with returns an instance on in's stores whose coordinator gets its shards
// through wrap (a store instance whose coordinator a test kills).
func (in *instance) with(wrap func([]twophase.Shard) []twophase.Shard) *instance {
	coord, err := twophase.New(wrap(in.shards), in.c.router)
	if err != nil {
		panic(err) // shards and router are valid: in was made from them
	}
	return &instance{c: in.c, stores: in.stores, shards: in.shards, coord: coord}
}

// instanceAt opens an instance whose store of shard i works at version v:
// the namespace is set back to v first (as a namespace never finalized past
// it), and the instance's stores follow it.
func (c *cluster) instanceAt(t testing.TB, i int, v storeversion.Version) *instance {
	t.Helper()
	_, err := shared[i].Put(context.Background(), schema.NewLayout(c.namespaces[i]).ActiveVersion(), schema.EncodeActiveVersion(v))
	require.NoError(t, err)
	in := c.instance(t, nil)
	require.Equal(t, v, in.stores[i].ActiveVersion())
	return in
}
