package sharded_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/sharded"
)

// shardOfNumber returns the shard a row number names (rowversion.go).
func shardOfNumber(t testing.TB, v authority.StoreVersion) int {
	t.Helper()
	n, ok := schema.ParseVersion(v)
	require.True(t, ok, "version %q", v)
	return int(n % sharded.VersionStride)
}

// TestAggregateAcrossShardsThroughTheStore: an aggregate with a row in
// every shard (two moved onto TargetB, one kept), its record in shard 1,
// prepared by one store and committed by another store of the same shards:
// every row changes, the moved rows' tokens name their shards, a retried
// commit is alreadyCommitted, and the capacity moved with the rows.
func TestAggregateAcrossShardsThroughTheStore(t *testing.T) {
	ctx := context.Background()
	shards := shardConfigs(t, clusterCount)
	s := newStore(t, 0, sharded.Config{Shards: shards})
	other := newStore(t, 0, sharded.Config{Shards: shards})
	fx := conformance.NewFixture(t, harnessFor(s, nil))
	a, ra := activeIn(t, fx, s, 0, "a", conformance.TargetA)
	b, rb := activeIn(t, fx, s, 1, "b", conformance.TargetA)
	c, rc := activeIn(t, fx, s, 2, "c", conformance.TargetA)
	req := conformance.AggregateRequest(aggregateIDIn(s, 1, "across"), 1, conformance.TargetB, authority.CapacityVector{Actors: 2},
		conformance.Participant(a, ra.StoreVersion, authority.TransitionNewOwner, []byte("a moved")),
		conformance.Participant(b, rb.StoreVersion, authority.TransitionPreserve, []byte("b kept")),
		conformance.Participant(c, rc.StoreVersion, authority.TransitionNewOwner, []byte("c moved")))
	fence := fx.MustPrepare(req)
	for i := range clusterCount {
		has, err := s.Shard(i).HasAggregate(ctx, fence)
		require.NoError(t, err)
		require.Equal(t, i == 1, has, "the record lives in the coordinator shard only (shard %d)", i)
	}
	fx.RequireUsage(conformance.NodeB, authority.ObjectActor, "", 0, 2)

	res, err := other.CommitAggregate(ctx, fence)
	require.NoError(t, err)
	require.Equal(t, authority.KindCommitted, res.Kind)
	require.Len(t, res.OwnershipTokens, 2)
	for _, k := range []authority.Key{a, c} {
		row := fx.MustRow(k)
		require.Equal(t, conformance.OwnerB, row.Owner())
		require.Equal(t, res.OwnershipTokens[k], row.OwnershipToken)
		require.Equal(t, int64(s.ShardOf(k)), row.OwnershipToken%sharded.VersionStride, "the token names the row's shard")
		require.Equal(t, s.ShardOf(k), shardOfNumber(t, row.StoreVersion))
	}
	require.Equal(t, []byte("b kept"), fx.MustRow(b).Payload)
	require.Equal(t, conformance.OwnerA, fx.MustRow(b).Owner())
	again, err := s.CommitAggregate(ctx, fence)
	require.NoError(t, err)
	require.Equal(t, authority.KindAlreadyCommitted, again.Kind)
	fx.RequireUsage(conformance.NodeB, authority.ObjectActor, "", 2, 0)
	fx.RequireUsage(conformance.NodeA, authority.ObjectActor, "", 1, 0)
}

// TestRowNumbersAreUniqueAcrossShards: two rows of two shards written at
// the same revision of their clusters (the shards' stores give them the
// same version) have different versions through the sharded store, each
// naming its shard; a compare-exchange with the other row's version is a
// conflict. The shards are two fresh clusters, whose revisions are lined
// up by a few writes.
func TestRowNumbersAreUniqueAcrossShards(t *testing.T) {
	etcdtest.SkipIfExternal(t, "the test lines up the revisions of two clusters of its own")
	ctx := context.Background()
	var fresh [2]*clientv3.Client
	var shards []etcdstore.Config
	for i := range fresh {
		fresh[i] = etcdtest.Start(t).Client(t)
		shards = append(shards, etcdstore.Config{Client: fresh[i], Namespace: etcdtest.Namespace()})
	}
	s := newStore(t, 0, sharded.Config{Shards: shards})
	fx := conformance.NewFixture(t, harnessFor(s, nil))
	x, rx := activeIn(t, fx, s, 0, "x", conformance.TargetA)
	y, ry := activeIn(t, fx, s, 1, "y", conformance.TargetA)
	for attempt := 0; ; attempt++ {
		require.Less(t, attempt, 20, "the clusters' revisions did not line up")
		alignRevisions(t, fresh[0], fresh[1], shards[0].Namespace+"scratch", shards[1].Namespace+"scratch")
		rx, ry = fx.Put(x, rx.StoreVersion, []byte("x")), fx.Put(y, ry.StoreVersion, []byte("y"))
		rawX, err := s.Shard(0).ReadAuthority(ctx, x)
		require.NoError(t, err)
		rawY, err := s.Shard(1).ReadAuthority(ctx, y)
		require.NoError(t, err)
		if rawX.Snapshot.StoreVersion == rawY.Snapshot.StoreVersion {
			break // the shards' stores give both rows one version
		}
	}
	require.NotEqual(t, rx.StoreVersion, ry.StoreVersion)
	require.Equal(t, 0, shardOfNumber(t, rx.StoreVersion))
	require.Equal(t, 1, shardOfNumber(t, ry.StoreVersion))
	res, err := s.CompareExchangeAuthority(ctx, x, ry.StoreVersion, authority.Put([]byte("wrong row's version")))
	require.NoError(t, err)
	require.Equal(t, authority.KindConflict, res.Kind)
	require.Equal(t, rx.StoreVersion, res.Current.Snapshot.StoreVersion)
	fx.Put(x, rx.StoreVersion, []byte("right version"))
}

// alignRevisions writes scratch keys in cluster a or b, whichever is
// behind, until both are at the same revision.
func alignRevisions(t testing.TB, a, b *clientv3.Client, scratchA, scratchB string) {
	t.Helper()
	ctx := context.Background()
	for {
		ra, err := a.Put(ctx, scratchA, "")
		require.NoError(t, err)
		rb, err := b.Put(ctx, scratchB, "")
		require.NoError(t, err)
		behind, key, n := a, scratchA, rb.Header.Revision-ra.Header.Revision
		if n < 0 {
			behind, key, n = b, scratchB, -n
		}
		if n == 0 {
			return
		}
		require.Less(t, n, int64(1000), "fresh clusters so far apart")
		for range n {
			_, err = behind.Put(ctx, key, "")
			require.NoError(t, err)
		}
	}
}

// lockedAggregate prepares, through s, an aggregate moving a (newOwner)
// and keeping b (preserve), and locks both rows in their shards as a
// commit attempt does, whose coordinator then stops: the aggregate stays
// prepared (decide false) or is decided committed but applied nowhere
// (decide true). It returns the fence.
func lockedAggregate(t *testing.T, s *sharded.Store, id string, a, b authority.Key, va, vb authority.StoreVersion, decide bool) authority.Fence {
	t.Helper()
	ctx := context.Background()
	req := conformance.AggregateRequest(id, 1, conformance.TargetB, authority.CapacityVector{Actors: 1},
		conformance.Participant(a, va, authority.TransitionNewOwner, []byte("moved by "+id)),
		conformance.Participant(b, vb, authority.TransitionPreserve, []byte("kept by "+id)))
	res, err := s.PrepareAggregate(ctx, req)
	require.NoError(t, err)
	require.Equal(t, authority.KindPrepared, res.Kind)
	cs := s.Shard(s.CoordinatorOf(id)).CrossShard()
	rec, err := cs.ReadRecord(ctx, req.Fence())
	require.NoError(t, err)
	att := etcdstore.LockAttempt{ID: "0123456789abcdef0123456789abcdef", Base: rec.Revision}
	for _, k := range []authority.Key{a, b} {
		lock, err := s.Shard(s.ShardOf(k)).CrossShard().LockParticipants(ctx, rec, []authority.Key{k}, att)
		require.NoError(t, err)
		require.Equal(t, etcdstore.LockHeld, lock.Kind, lock.Reason)
	}
	if decide {
		_, ok, err := cs.Decide(ctx, rec, true)
		require.NoError(t, err)
		require.True(t, ok)
	}
	return req.Fence()
}

// TestWritesAndReadsResolveRowLocksThroughTheStore: rows locked by a
// cross-shard commit whose coordinator stopped. A shard's own store refuses
// to write them (ErrRowLocked); through the sharded store a
// compare-exchange, RemoveAllByOwner and RebindRows resolve the lock (the
// undecided aggregate is taken over and stays prepared, then its commit is
// stale) and write, and a read of a row of a committed aggregate applies it
// first.
func TestWritesAndReadsResolveRowLocksThroughTheStore(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, clusterCount, sharded.Config{})
	fx := conformance.NewFixture(t, harnessFor(s, nil))

	a, ra := activeIn(t, fx, s, 0, "cas-a", conformance.TargetA)
	b, rb := activeIn(t, fx, s, 2, "cas-b", conformance.TargetA)
	fence := lockedAggregate(t, s, "cas", a, b, ra.StoreVersion, rb.StoreVersion, false)
	raw, err := s.Shard(0).ReadAuthority(ctx, a)
	require.NoError(t, err)
	_, err = s.Shard(0).CompareExchangeAuthority(ctx, a, raw.Snapshot.StoreVersion, authority.Put([]byte("direct")))
	require.ErrorIs(t, err, etcdstore.ErrRowLocked)
	put, err := s.CompareExchangeAuthority(ctx, a, ra.StoreVersion, authority.Put([]byte("writer")))
	require.NoError(t, err)
	require.Equal(t, authority.KindStored, put.Kind)
	commit, err := s.CommitAggregate(ctx, fence)
	require.NoError(t, err)
	require.Equal(t, authority.KindStale, commit.Kind, "the write came first: the aggregate's row changed")
	aborted, err := s.AbortAggregate(ctx, fence)
	require.NoError(t, err)
	require.Equal(t, authority.KindAborted, aborted.Kind)

	c, rc := activeIn(t, fx, s, 1, "read-c", conformance.TargetA)
	d, rd := activeIn(t, fx, s, 2, "read-d", conformance.TargetA)
	lockedAggregate(t, s, "read", c, d, rc.StoreVersion, rd.StoreVersion, true)
	raw, err = s.Shard(1).ReadAuthority(ctx, c)
	require.NoError(t, err)
	require.Equal(t, rc.Payload, raw.Snapshot.Payload, "decided, applied nowhere yet")
	read := fx.MustRow(c)
	require.Equal(t, []byte("moved by read"), read.Payload, "a read applies the committed aggregate first")
	require.Equal(t, conformance.OwnerB, read.Owner())
	require.Equal(t, []byte("kept by read"), fx.MustRow(d).Payload)

	removeAndRebind(t, s, fx)
}

// removeAndRebind: RemoveAllByOwner and RebindRows of rows locked by an
// undecided aggregate resolve the locks and move or remove every row.
func removeAndRebind(t *testing.T, s *sharded.Store, fx *conformance.Fixture) {
	ctx := context.Background()
	old, err := s.Registry().Acquire(ctx, conformance.NodeA, conformance.NodeLifecycle, "locked-owner", 10*time.Second)
	require.NoError(t, err)
	target := conformance.Target(conformance.NodeA, conformance.NodeLifecycle, old.Token())
	e, re := activeIn(t, fx, s, 0, "rebind-e", target)
	f, rf := activeIn(t, fx, s, 1, "rebind-f", target)
	rebound := lockedAggregate(t, s, "rebind", e, f, re.StoreVersion, rf.StoreVersion, false)
	next, err := s.Registry().Acquire(ctx, conformance.NodeA, conformance.NodeLifecycle, "locked-owner", 10*time.Second)
	require.NoError(t, err)
	defer next.Close(ctx)
	require.NoError(t, old.Close(ctx))
	n, err := next.RebindRows(ctx, old.Token())
	require.NoError(t, err)
	require.Equal(t, int64(2), n)
	require.Equal(t, next.Token(), fx.MustRow(e).Owner())
	stale, err := s.CommitAggregate(ctx, rebound)
	require.NoError(t, err)
	require.Equal(t, authority.KindStale, stale.Kind)

	ve, vf := fx.MustRow(e).StoreVersion, fx.MustRow(f).StoreVersion
	removed := lockedAggregate(t, s, "remove", e, f, ve, vf, false)
	n, err = s.RemoveAllByOwner(ctx, next.Token())
	require.NoError(t, err)
	require.Equal(t, int64(2), n)
	fx.RequireMissing(e)
	fx.RequireMissing(f)
	stale, err = s.CommitAggregate(ctx, removed)
	require.NoError(t, err)
	require.Equal(t, authority.KindStale, stale.Kind)
}
