package sharded_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/sharded"
)

// liveness reads the liveness key of owner on node@1 in a shard (nil:
// absent).
func liveness(t testing.TB, sc etcdstore.Config, node authority.NodeDescriptor, owner authority.OwnerToken) *clientv3.GetResponse {
	t.Helper()
	resp, err := sc.Client.Get(context.Background(), schema.NewLayout(sc.Namespace).Liveness(node, 1, owner))
	require.NoError(t, err)
	return resp
}

func ownerGeneration(t testing.TB, sc etcdstore.Config, owner string) int64 {
	t.Helper()
	resp, err := sc.Client.Get(context.Background(), schema.NewLayout(sc.Namespace).OwnerGen(owner))
	require.NoError(t, err)
	if len(resp.Kvs) == 0 {
		return 0
	}
	gen, err := strconv.ParseInt(string(resp.Kvs[0].Value), 10, 64)
	require.NoError(t, err)
	return gen
}

// TestOwnerLeaseHeldInEveryShard: Acquire takes one generation in every
// shard (each shard's owner generation and liveness key), the next Acquire
// the next one everywhere, and Close revokes every shard's lease.
func TestOwnerLeaseHeldInEveryShard(t *testing.T) {
	ctx := context.Background()
	shards := shardConfigs(t, clusterCount)
	s := newStore(t, 0, sharded.Config{Shards: shards})
	first, err := s.Registry().Acquire(ctx, conformance.NodeA, 1, "owner-x", 10*time.Second)
	require.NoError(t, err)
	second, err := s.Registry().Acquire(ctx, conformance.NodeA, 1, "owner-x", 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, int64(1), first.Token().LeaseGeneration)
	require.Equal(t, int64(2), second.Token().LeaseGeneration)
	for i, sc := range shards {
		require.Equal(t, int64(2), ownerGeneration(t, sc, "owner-x"), "shard %d", i)
		for _, l := range []*sharded.OwnerLease{first, second} {
			resp := liveness(t, sc, conformance.NodeA, l.Token())
			require.Len(t, resp.Kvs, 1, "shard %d has no liveness key of %v", i, l.Token())
			require.NotZero(t, resp.Kvs[0].Lease)
		}
	}
	live, err := s.IsTargetLive(ctx, conformance.NodeA, 1, first.Token())
	require.NoError(t, err)
	require.True(t, live)
	require.True(t, first.Deadline().After(time.Now()))
	require.NoError(t, first.Close(ctx))
	<-first.Done()
	for i, sc := range shards {
		require.Empty(t, liveness(t, sc, conformance.NodeA, first.Token()).Kvs, "shard %d kept the closed lease's key", i)
		require.Len(t, liveness(t, sc, conformance.NodeA, second.Token()).Kvs, 1)
	}
	live, err = s.IsTargetLive(ctx, conformance.NodeA, 1, first.Token())
	require.NoError(t, err)
	require.False(t, live)
	require.NoError(t, second.Close(ctx))
}

// keyInShard returns an actor key of s's shard i, and its global ID.
func keyInShard(t testing.TB, s *sharded.Store, i int, prefix string) (authority.Key, string) {
	t.Helper()
	for n := 0; ; n++ {
		id := fmt.Sprintf("%s-%d", prefix, n)
		key, err := authority.EncodeKey(authority.ObjectActor, id)
		require.NoError(t, err)
		if s.ShardOf(key) == i {
			return key, id
		}
	}
}

// TestLosingOneShardsLeaseEndsTheOwner: the owner's lease in one shard is
// revoked behind its back; Done closes, the other shards' leases are
// revoked, and the owner's writes fail in every shard.
func TestLosingOneShardsLeaseEndsTheOwner(t *testing.T) {
	ctx := context.Background()
	shards := shardConfigs(t, clusterCount)
	s := newStore(t, 0, sharded.Config{Shards: shards})
	fx := conformance.NewFixture(t, harnessFor(s, nil))
	l, err := s.Registry().Acquire(ctx, conformance.NodeA, 1, "doomed", 10*time.Second)
	require.NoError(t, err)
	defer l.Close(ctx)
	target := conformance.Target(conformance.NodeA, 1, l.Token())
	for i := range shards {
		_, id := keyInShard(t, s, i, "before")
		fx.Reserve(authority.ObjectActor, id, target)
	}
	lost := (s.OwnerHome("doomed") + 1) % len(shards)
	resp := liveness(t, shards[lost], conformance.NodeA, l.Token())
	require.Len(t, resp.Kvs, 1)
	_, err = shards[lost].Client.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease))
	require.NoError(t, err)
	select {
	case <-l.Done():
	case <-time.After(time.Minute):
		t.Fatal("Done did not close after the lease was revoked in one shard")
	}
	for i, sc := range shards {
		require.Eventually(t, func() bool { return len(liveness(t, sc, conformance.NodeA, l.Token()).Kvs) == 0 },
			time.Minute, 10*time.Millisecond, "shard %d's liveness key stayed", i)
	}
	for i := range shards {
		_, id := keyInShard(t, s, i, "after")
		res, err := s.Reserve(ctx, fx.ReserveRequest(authority.ObjectActor, id, target))
		require.NoError(t, err)
		require.Equal(t, authority.KindConflict, res.Kind, "shard %d admitted a write of the lost owner", i)
	}
}

// TestAcquireNeedsTheGenerationInEveryShard: a shard that already handed
// the owner a later generation (another process took it there) refuses
// the home shard's generation; Acquire fails with ErrGenerationTaken naming
// the shard, and the leases it took are revoked.
func TestAcquireNeedsTheGenerationInEveryShard(t *testing.T) {
	ctx := context.Background()
	shards := shardConfigs(t, clusterCount)
	s := newStore(t, 0, sharded.Config{Shards: shards})
	ahead := (s.OwnerHome("contested") + 1) % len(shards)
	for range 3 {
		l, err := s.Shard(ahead).Registry().Acquire(ctx, conformance.NodeA, 1, "contested", 10*time.Second)
		require.NoError(t, err)
		require.NoError(t, l.Close(ctx))
	}
	_, err := s.Registry().Acquire(ctx, conformance.NodeA, 1, "contested", 10*time.Second)
	require.ErrorIs(t, err, etcdstore.ErrGenerationTaken)
	require.ErrorIs(t, err, etcdstore.ErrLeaseLost)
	require.ErrorContains(t, err, fmt.Sprintf("shard %d", ahead))
	for i, sc := range shards {
		require.Empty(t, liveness(t, sc, conformance.NodeA, authority.OwnerToken{OwnerID: "contested", LeaseGeneration: 1}).Kvs,
			"shard %d kept a liveness key of the refused generation", i)
	}
	// the home shard moved on: the next Acquire gets a generation above
	// every shard's only once the home shard's passes the ahead one's
	var l *sharded.OwnerLease
	for range 4 {
		if l, err = s.Registry().Acquire(ctx, conformance.NodeA, 1, "contested", 10*time.Second); err == nil {
			break
		}
		require.ErrorIs(t, err, etcdstore.ErrGenerationTaken)
	}
	require.NoError(t, err)
	defer l.Close(ctx)
	require.Equal(t, int64(4), l.Token().LeaseGeneration)
}

// TestRebindAndRemoveAcrossShards: an owner's rows in every shard move to
// its next lease generation with one RebindRows, and RemoveAllByOwner
// removes them from every shard, each returning the total.
func TestRebindAndRemoveAcrossShards(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, clusterCount, sharded.Config{})
	fx := conformance.NewFixture(t, harnessFor(s, nil))
	old, err := s.Registry().Acquire(ctx, conformance.NodeA, 1, "mover", 10*time.Second)
	require.NoError(t, err)
	var keys []authority.Key
	for i := range clusterCount {
		for j := range 4 {
			key, id := keyInShard(t, s, i, fmt.Sprintf("row%d", j))
			fx.Active(authority.ObjectActor, id, conformance.Target(conformance.NodeA, 1, old.Token()))
			keys = append(keys, key)
		}
	}
	next, err := s.Registry().Acquire(ctx, conformance.NodeA, 1, "mover", 10*time.Second)
	require.NoError(t, err)
	defer next.Close(ctx)
	require.NoError(t, old.Close(ctx))
	n, err := next.RebindRows(ctx, old.Token())
	require.NoError(t, err)
	require.Equal(t, int64(len(keys)), n)
	for _, k := range keys {
		require.Equal(t, next.Token(), fx.MustRow(k).Owner())
	}
	n, err = s.RemoveAllByOwner(ctx, next.Token())
	require.NoError(t, err)
	require.Equal(t, int64(len(keys)), n)
	for _, k := range keys {
		fx.RequireMissing(k)
	}
}
