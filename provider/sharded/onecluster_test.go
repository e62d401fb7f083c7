package sharded_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/sharded"
)

// TestOneShardOverASingleClusterNamespace: a namespace written by today's
// single-cluster store opens as a store of one shard without a rewrite (no
// map is written), and the two work side by side: each reads, lists and
// follows what the other writes, owner generations continue, blobs and
// the cluster ID are the same.
func TestOneShardOverASingleClusterNamespace(t *testing.T) {
	ctx := context.Background()
	sc := shardConfigs(t, 1)[0]
	plain, err := etcdstore.New(ctx, sc)
	require.NoError(t, err)
	defer plain.Close()
	pfx := conformance.NewFixture(t, plainHarness(plain))
	for _, id := range []string{"a", "b", "c", "d"} {
		pfx.Active(authority.ObjectActor, id, conformance.TargetA)
	}
	a, b := pfx.MustRow(pfx.Key(authority.ObjectActor, "a")), pfx.MustRow(pfx.Key(authority.ObjectActor, "b"))
	fence := pfx.MustPrepare(conformance.AggregateRequest("move", 1, conformance.TargetB, authority.CapacityVector{Actors: 1},
		conformance.Participant(pfx.Key(authority.ObjectActor, "a"), a.StoreVersion, authority.TransitionNewOwner, []byte("moved")),
		conformance.Participant(pfx.Key(authority.ObjectActor, "b"), b.StoreVersion, authority.TransitionPreserve, []byte("kept"))))
	blob, err := plain.Relocation().PutNew(ctx, []byte("blob"), time.Hour)
	require.NoError(t, err)
	lease, err := plain.Registry().Acquire(ctx, conformance.NodeA, 1, "node-owner", 10*time.Second)
	require.NoError(t, err)
	require.NoError(t, lease.Close(ctx))

	s := newStore(t, 0, sharded.Config{Shards: []etcdstore.Config{sc}})
	m, _ := storedMap(t, sc)
	require.Nil(t, m, "opening a single cluster's namespace wrote a shard map")
	sfx := conformance.NewFixture(t, harnessFor(s, nil))

	// reads and listings agree
	requireSameListing(t, pfx.ListAll("", 2), sfx.ListAll("", 3))
	res, err := s.CommitAggregate(ctx, fence)
	require.NoError(t, err)
	require.Equal(t, authority.KindCommitted, res.Kind, "an aggregate the single-cluster store prepared commits through the sharded one")
	moved := sfx.MustRow(pfx.Key(authority.ObjectActor, "a"))
	require.Equal(t, conformance.OwnerB, moved.Owner())

	// each follows the other's writes
	feed, err := s.WatchRows(ctx, authority.FeedRequest{})
	require.NoError(t, err)
	defer feed.Close()
	start, err := feed.Next(ctx)
	require.NoError(t, err)
	rev, err := plain.FeedRevision(ctx)
	require.NoError(t, err)
	require.Equal(t, authority.FeedPosition{rev}, start.Position, "one shard's position is its cluster's revision")
	require.Equal(t, rev, start.Revision)
	c := pfx.MustRow(pfx.Key(authority.ObjectActor, "c"))
	put := pfx.Put(pfx.Key(authority.ObjectActor, "c"), c.StoreVersion, []byte("written by the single-cluster store"))
	batch, err := feed.Next(ctx)
	require.NoError(t, err)
	require.Len(t, batch.Events, 1)
	conformance.RequireSameRow(t, put, batch.Events[0].Snapshot)
	require.Equal(t, put.StoreVersion, authority.StoreVersion(itoa(batch.Revision)), "the revision is the etcd revision")
	d := sfx.MustRow(pfx.Key(authority.ObjectActor, "d"))
	again := sfx.Put(pfx.Key(authority.ObjectActor, "d"), d.StoreVersion, []byte("written by the sharded store"))
	conformance.RequireSameRow(t, again, pfx.MustRow(pfx.Key(authority.ObjectActor, "d")))
	resumed, err := s.WatchRows(ctx, authority.FeedRequest{After: batch.Revision})
	require.NoError(t, err, "one shard resumes after a revision too")
	defer resumed.Close()
	next, err := resumed.Next(ctx)
	require.NoError(t, err)
	require.Equal(t, pfx.Key(authority.ObjectActor, "d"), next.Events[0].Key)

	// blobs, cluster, owner generations, removal
	got, err := s.Relocation().Read(ctx, blob.Reference)
	require.NoError(t, err)
	require.Equal(t, "blob", string(got.Bytes))
	want, err := plain.ClusterID(ctx)
	require.NoError(t, err)
	id, err := s.ClusterID(ctx)
	require.NoError(t, err)
	require.Equal(t, want, id)
	next2, err := s.Registry().Acquire(ctx, conformance.NodeA, 1, "node-owner", 10*time.Second)
	require.NoError(t, err)
	defer next2.Close(ctx)
	require.Equal(t, int64(2), next2.Token().LeaseGeneration, "the generation goes on from the single-cluster store's")
	n, err := s.RemoveAllByOwner(ctx, conformance.OwnerA)
	require.NoError(t, err)
	require.Equal(t, int64(3), n)
	require.Len(t, pfx.ListAll("", 10), 1)
	m, _ = storedMap(t, sc)
	require.Nil(t, m)
}

// requireSameListing requires two listings of the same rows (StoreNow
// aside).
func requireSameListing(t testing.TB, want, got []authority.ScanItem) {
	t.Helper()
	require.Len(t, got, len(want))
	for i := range want {
		require.Equal(t, want[i].Key, got[i].Key)
		conformance.RequireSameRow(t, want[i].Snapshot, got[i].Snapshot)
	}
}
