package reshard_test

import (
	"context"
	"errors"
	"fmt"
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
	"github.com/zlink-systems/authority/provider/sharded/reshard"
	"github.com/zlink-systems/authority/provider/sharded/twophase"
)

// Aggregates across shards through a growth from two shards to three.

// aggEnv is a store over two of the clusters (the third a spare), an owner
// holding rows, and a fixture over the store.
type aggEnv struct {
	t    *testing.T
	ctx  context.Context
	cs   []etcdstore.Config
	s    *sharded.Store
	fx   *conformance.Fixture
	from authority.CreationTarget
}

func newAggEnv(t *testing.T) *aggEnv {
	ctx := context.Background()
	cs := clusters(t)
	s := openStore(t, cs, 2, 1, nil)
	lease, err := s.Registry().Acquire(ctx, conformance.NodeA, 1, "agg-owner", 20*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { _ = lease.Close(context.Background()) })
	return &aggEnv{t: t, ctx: ctx, cs: cs, s: s, fx: conformance.NewFixture(t, harness(s, nil)),
		from: conformance.Target(conformance.NodeA, 1, lease.Token())}
}

// row creates an active user spot whose row is in shard before of two and
// in shard after of three.
func (e *aggEnv) row(prefix string, before, after int) (authority.Key, *authority.Snapshot) {
	e.t.Helper()
	for i := range 10000 {
		id := fmt.Sprintf("%s-%d", prefix, i)
		k := e.fx.Key(authority.ObjectUserSpot, id)
		if sharded.Place(k, 2) == before && sharded.Place(k, 3) == after {
			return k, e.fx.Active(authority.ObjectUserSpot, id, e.from)
		}
	}
	e.t.Fatalf("no row for %s in shard %d then %d", prefix, before, after)
	return "", nil
}

// aggregateID returns an aggregate ID starting with prefix whose record a
// hash over every shard of the map would put in shard 0 or 1 of two and in
// shard 2 of three: an ID whose record a store that rehashed it over the
// grown map would look for in the wrong shard.
func aggregateID(t testing.TB, prefix string) string {
	t.Helper()
	two, three := schema.ShardMap{Shards: make([]schema.ShardMapShard, 2)}, schema.ShardMap{Shards: make([]schema.ShardMapShard, 3)}
	for i := range 10000 {
		id := fmt.Sprintf("%s-%d", prefix, i)
		if sharded.PlaceCoordinator(id, three) == 2 && sharded.PlaceCoordinator(id, two) < 2 {
			return id
		}
	}
	t.Fatalf("no aggregate ID for %s", prefix)
	return ""
}

// request is a cross-shard aggregate moving rows onto TargetB (its
// capacity theirs), each row taking payload "<id>:<key>".
func (e *aggEnv) request(id string, rows map[authority.Key]*authority.Snapshot) authority.AggregatePrepareRequest {
	e.t.Helper()
	var parts []authority.AggregateParticipant
	capacity := authority.CapacityVector{}
	for k, r := range rows {
		parts = append(parts, conformance.Participant(k, r.StoreVersion, authority.TransitionNewOwner, []byte(id+":"+string(k))))
		var err error
		capacity, err = authority.AddCapacity(capacity, conformance.Capacity(authority.ObjectUserSpot, conformance.DefaultStableType))
		require.NoError(e.t, err)
	}
	return conformance.AggregateRequest(id, 1, conformance.TargetB, capacity, parts...)
}

// grow runs the move from two shards to three, and returns a store opened
// on the grown map (the store over two shards runs capacity escrow, which
// does not follow a growth: it is reopened).
func (e *aggEnv) grow() *sharded.Store {
	e.t.Helper()
	grow(e.t, e.cs, 2, func(c *reshard.Config) {
		c.AggregateWait = 100 * time.Millisecond
		c.LeaseWait = 100 * time.Millisecond
	})
	s, err := sharded.New(e.ctx, sharded.Config{Shards: e.cs, Epoch: 2})
	require.NoError(e.t, err)
	e.t.Cleanup(func() { _ = s.Close() })
	require.Equal(e.t, 3, s.Shards())
	return s
}

// noLocks checks that no namespace holds a row lock.
func (e *aggEnv) noLocks() {
	e.t.Helper()
	for i, c := range e.cs {
		require.Zero(e.t, keyCount(e.t, c, schema.SegRowLocks+"/"), "row locks left in cluster %d", i)
	}
}

// payloads checks each row's payload through st.
func payloads(t testing.TB, st authority.Store, want map[authority.Key]string) {
	t.Helper()
	for k, p := range want {
		res, err := st.ReadAuthority(context.Background(), k)
		require.NoError(t, err)
		require.Equal(t, authority.KindSnapshot, res.Kind, "row %s", k)
		require.Equal(t, p, string(res.Snapshot.Payload), "row %s", k)
	}
}

// usageB is the target node's user spot usage through st, over every
// shard.
func (e *aggEnv) usageB(st *sharded.Store) authority.CapacityUsage {
	e.t.Helper()
	u, err := st.CapacityUsage(e.ctx, conformance.NodeB, conformance.NodeLifecycle, authority.ObjectUserSpot, conformance.DefaultStableType)
	require.NoError(e.t, err)
	return u
}

// errInjected is the failure faultyShard injects.
var errInjected = errors.New("injected failure")

// faultyShard is a shard of the two-phase protocol whose decision or whose
// apply fails, as a coordinator that died there would leave it.
type faultyShard struct {
	twophase.Shard
	failDecide, failApply bool
}

func (f faultyShard) Decide(ctx context.Context, rec *etcdstore.CrossRecord, commit bool) (*etcdstore.CrossRecord, bool, error) {
	if f.failDecide {
		return nil, false, authority.Wrap(authority.ErrOutcomeUnknown, "the decision's outcome is unknown", errInjected)
	}
	return f.Shard.Decide(ctx, rec, commit)
}

func (f faultyShard) ApplyParticipants(ctx context.Context, rec *etcdstore.CrossRecord, keys []authority.Key) (map[authority.Key]int64, error) {
	if f.failApply {
		return nil, errInjected
	}
	return f.Shard.ApplyParticipants(ctx, rec, keys)
}

// storeRouter routes as the store does.
type storeRouter struct{ s *sharded.Store }

func (r storeRouter) ShardOf(key authority.Key) int        { return r.s.ShardOf(key) }
func (r storeRouter) CoordinatorOf(aggregateID string) int { return r.s.CoordinatorOf(aggregateID) }

// interruptedCommit commits fence with a coordinator over the store's
// shards (before the growth) that stops as one that died would: at its
// decision (every row locked, nothing decided) when failDecide, else after
// deciding, with shard applyFails's rows not applied (still locked).
func (e *aggEnv) interruptedCommit(fence authority.Fence, failDecide bool, applyFails int) {
	e.t.Helper()
	shards := make([]twophase.Shard, e.s.Shards())
	for i := range shards {
		shards[i] = faultyShard{Shard: twophase.EtcdShard(e.s.Shard(i)), failDecide: failDecide, failApply: !failDecide && i == applyFails}
	}
	coord, err := twophase.New(shards, storeRouter{e.s})
	require.NoError(e.t, err)
	_, err = coord.CommitAggregate(e.ctx, fence)
	require.ErrorIs(e.t, err, errInjected)
	require.ErrorIs(e.t, err, authority.ErrOutcomeUnknown)
}

// TestCrossShardAggregateOfStayingRowsCommitsAfterGrowth: an aggregate
// across shards prepared before a growth from two shards to three, whose
// participants stay, commits after it through a store on the grown map:
// its record is in the same coordinator shard before and after (the map's
// home shards), and its capacity ends as the rows' own entries.
func TestCrossShardAggregateOfStayingRowsCommitsAfterGrowth(t *testing.T) {
	e := newAggEnv(t)
	k0, r0 := e.row("stay0", 0, 0)
	k1, r1 := e.row("stay1", 1, 1)
	id := aggregateID(t, "staying")
	f := e.fx.MustPrepare(e.request(id, map[authority.Key]*authority.Snapshot{k0: r0, k1: r1}))
	coord := e.s.CoordinatorOf(id)
	s := e.grow()

	res, err := s.CommitAggregate(e.ctx, f)
	require.NoError(t, err)
	require.Equal(t, authority.KindCommitted, res.Kind)
	require.Len(t, res.OwnershipTokens, 2)
	require.Equal(t, coord, s.CoordinatorOf(id), "the coordinator shard does not change when the map grows")
	payloads(t, s, map[authority.Key]string{k0: id + ":" + string(k0), k1: id + ":" + string(k1)})
	require.Equal(t, authority.CapacityUsage{Active: 2}, e.usageB(s), "the parts became the rows' entries")
	e.noLocks()
}

// TestCrossShardAggregateOfMovingRowIsAbortedBySwitch: aggregates across
// shards prepared before a growth with a participant that moves to the new
// cluster, one of them with its rows locked by a commit that stopped
// before deciding, are aborted by the switch through the two-phase
// protocol: afterwards their commit answers stale and their abort
// alreadyAborted, their rows are unchanged, no lock is left anywhere and
// the target's capacity holds none of their parts.
func TestCrossShardAggregateOfMovingRowIsAbortedBySwitch(t *testing.T) {
	e := newAggEnv(t)
	before := e.usageB(e.s)
	k0, r0 := e.row("mv-stay", 0, 0)
	k1, r1 := e.row("mv-move", 1, 2)
	j0, q0 := e.row("mv-stay-b", 0, 0)
	j1, q1 := e.row("mv-move-b", 1, 2)
	plain := e.fx.MustPrepare(e.request(aggregateID(t, "moving-plain"), map[authority.Key]*authority.Snapshot{k0: r0, k1: r1}))
	locked := e.fx.MustPrepare(e.request(aggregateID(t, "moving-locked"), map[authority.Key]*authority.Snapshot{j0: q0, j1: q1}))
	require.Equal(t, authority.CapacityUsage{Reserved: 4}, e.usageB(e.s))
	e.interruptedCommit(locked, true, -1)
	require.Equal(t, int64(1), keyCount(t, e.cs[1], schema.SegRowLocks+"/"), "the stopped commit left its lock on the moving row")

	s := e.grow()
	for _, f := range []authority.Fence{plain, locked} {
		res, err := s.CommitAggregate(e.ctx, f)
		require.NoError(t, err)
		require.Equal(t, authority.KindStale, res.Kind, "the switch aborted aggregate %s", f.AggregateID)
		ab, err := s.AbortAggregate(e.ctx, f)
		require.NoError(t, err)
		require.Equal(t, authority.KindAlreadyAborted, ab.Kind)
	}
	payloads(t, s, map[authority.Key]string{k0: string(r0.Payload), k1: string(r1.Payload), j0: string(q0.Payload), j1: string(q1.Payload)})
	e.noLocks()
	require.Equal(t, before, e.usageB(s), "no part is left")
	for _, k := range []authority.Key{k1, j1} {
		require.Equal(t, 2, s.ShardOf(k))
		r, err := s.ReadAuthority(e.ctx, k)
		require.NoError(t, err)
		res, err := s.CompareExchangeAuthority(e.ctx, k, r.Snapshot.StoreVersion, authority.Put([]byte("after")))
		require.NoError(t, err)
		require.Equal(t, authority.KindStored, res.Kind, "the moved row is not locked")
	}
}

// TestCrossShardCommitLeftOnMovingRowIsFinishedBySwitch: an aggregate
// across shards committed before a growth whose coordinator stopped before
// applying the shard of a participant that moves (its row still locked
// there) is applied by the switch before the row is copied: after the
// growth every participant holds the aggregate's payload (all or nothing),
// no lock is left, and a commit retried answers alreadyCommitted.
func TestCrossShardCommitLeftOnMovingRowIsFinishedBySwitch(t *testing.T) {
	e := newAggEnv(t)
	k0, r0 := e.row("left-stay", 0, 0)
	k1, r1 := e.row("left-move", 1, 2)
	id := aggregateID(t, "left")
	f := e.fx.MustPrepare(e.request(id, map[authority.Key]*authority.Snapshot{k0: r0, k1: r1}))
	e.interruptedCommit(f, false, 1)
	require.Equal(t, int64(1), keyCount(t, e.cs[1], schema.SegRowLocks+"/"), "the moving row's shard was not applied")
	res, err := e.s.Shard(0).ReadAuthority(e.ctx, k0)
	require.NoError(t, err)
	require.Equal(t, id+":"+string(k0), string(res.Snapshot.Payload), "the other shard was applied")

	s := e.grow()
	require.Equal(t, 2, s.ShardOf(k1))
	want := map[authority.Key]string{k0: id + ":" + string(k0), k1: id + ":" + string(k1)}
	raw, err := s.Shard(2).ReadAuthority(e.ctx, k1)
	require.NoError(t, err)
	require.Equal(t, want[k1], string(raw.Snapshot.Payload), "the row was copied applied")
	payloads(t, s, want)
	c, err := s.CommitAggregate(e.ctx, f)
	require.NoError(t, err)
	require.Equal(t, authority.KindAlreadyCommitted, c.Kind)
	require.Equal(t, authority.CapacityUsage{Active: 2}, e.usageB(s))
	e.noLocks()
}

// TestCrossShardCommitRetriedAfterGrowth: commits retried after a growth
// of aggregates across shards committed before it answer alreadyCommitted:
// one applied whole, and one whose coordinator stopped before applying a
// shard of rows that stay (its lock left there), which a read of its rows
// (or the retry) finishes: every participant holds its payload and no lock
// is left.
func TestCrossShardCommitRetriedAfterGrowth(t *testing.T) {
	e := newAggEnv(t)
	k0, r0 := e.row("done-0", 0, 0)
	k1, r1 := e.row("done-1", 1, 1)
	j0, q0 := e.row("half-0", 0, 0)
	j1, q1 := e.row("half-1", 1, 1)
	done, half := aggregateID(t, "done"), aggregateID(t, "half")
	fd := e.fx.MustPrepare(e.request(done, map[authority.Key]*authority.Snapshot{k0: r0, k1: r1}))
	fh := e.fx.MustPrepare(e.request(half, map[authority.Key]*authority.Snapshot{j0: q0, j1: q1}))
	res, err := e.s.CommitAggregate(e.ctx, fd)
	require.NoError(t, err)
	require.Equal(t, authority.KindCommitted, res.Kind)
	e.interruptedCommit(fh, false, 1)

	s := e.grow()
	payloads(t, s, map[authority.Key]string{j1: half + ":" + string(j1)})
	for _, f := range []authority.Fence{fd, fh} {
		c, err := s.CommitAggregate(e.ctx, f)
		require.NoError(t, err)
		require.Equal(t, authority.KindAlreadyCommitted, c.Kind, "aggregate %s", f.AggregateID)
	}
	payloads(t, s, map[authority.Key]string{k0: done + ":" + string(k0), k1: done + ":" + string(k1), j0: half + ":" + string(j0)})
	e.noLocks()
	require.Equal(t, authority.CapacityUsage{Active: 4}, e.usageB(s))
}

// TestHomeShardsKeptBySecondGrowth: a map of two shards grown to three and
// then to four keeps its home shards at two (the move starts from the map
// in force with its home shards), so an aggregate across shards prepared
// on two shards, whose rows stay, commits through a store on four. The
// fourth shard is a second namespace of one of the clusters.
func TestHomeShardsKeptBySecondGrowth(t *testing.T) {
	e := newAggEnv(t)
	var k0, k1 authority.Key
	var r0, r1 *authority.Snapshot
	for i := 0; k0 == "" || k1 == ""; i++ {
		id := fmt.Sprintf("kept-%d", i)
		k := e.fx.Key(authority.ObjectUserSpot, id)
		p := sharded.Place(k, 2)
		if p != sharded.Place(k, 3) || p != sharded.Place(k, 4) {
			continue
		}
		switch {
		case p == 0 && k0 == "":
			k0, r0 = k, e.fx.Active(authority.ObjectUserSpot, id, e.from)
		case p == 1 && k1 == "":
			k1, r1 = k, e.fx.Active(authority.ObjectUserSpot, id, e.from)
		}
	}
	id := aggregateID(t, "kept")
	f := e.fx.MustPrepare(e.request(id, map[authority.Key]*authority.Snapshot{k0: r0, k1: r1}))
	e.grow()
	ns := etcdtest.Namespace()
	c := clients[1]
	t.Cleanup(func() { _, _ = c.Delete(context.Background(), ns, clientv3.WithPrefix()) })
	cs := append(append([]etcdstore.Config(nil), e.cs...), etcdstore.Config{Client: c, Namespace: ns})
	grow(t, cs, 3, func(c *reshard.Config) { c.LeaseWait, c.AggregateWait = 100*time.Millisecond, 100*time.Millisecond })
	s, err := sharded.New(e.ctx, sharded.Config{Shards: cs, Epoch: 3})
	require.NoError(t, err)
	defer func() { _ = s.Close() }()
	for i := range cs {
		k, err := s.Shard(i).Moves().ReadMap(e.ctx)
		require.NoError(t, err)
		require.Equal(t, 4, len(k.Current.Shards))
		require.Equal(t, 2, k.Current.Homes(), "shard %d's map", i)
	}
	res, err := s.CommitAggregate(e.ctx, f)
	require.NoError(t, err)
	require.Equal(t, authority.KindCommitted, res.Kind)
	payloads(t, s, map[authority.Key]string{k0: id + ":" + string(k0), k1: id + ":" + string(k1)})
}

// TestGrownFromOneKeepsHomesInFirstCluster: a namespace grown from one
// cluster keeps one home shard (Homes() 1 in every cluster's map, after
// 1 → 2 and 2 → 3), so a cross-shard aggregate's coordinator record is in
// cluster 0, where its escrow ledgers are too (escrow.HomeOf), even for an
// ID a hash over two shards puts in shard 1; prepared on two shards, it
// commits through a store on three.
func TestGrownFromOneKeepsHomesInFirstCluster(t *testing.T) {
	ctx := context.Background()
	cs := clusters(t)
	s := openStore(t, cs, 1, 1, nil)
	lease, err := s.Registry().Acquire(ctx, conformance.NodeA, 1, "homes-owner", 20*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { _ = lease.Close(context.Background()) })
	e := &aggEnv{t: t, ctx: ctx, cs: cs, s: s, fx: conformance.NewFixture(t, harness(s, nil)),
		from: conformance.Target(conformance.NodeA, 1, lease.Token())}
	k0, r0 := e.row("home0", 0, 0)
	k1, r1 := e.row("home1", 1, 1)
	waits := func(c *reshard.Config) { c.LeaseWait, c.AggregateWait = 100*time.Millisecond, 100*time.Millisecond }
	grow(t, cs, 1, waits)
	requireHomes := func(n int) {
		t.Helper()
		for i := range n {
			k, err := etcdMapKeys(ctx, cs[i])
			require.NoError(t, err)
			require.Len(t, k.Shards, n)
			require.True(t, k.Raw)
			require.Equal(t, 1, k.Homes(), "shard %d's map keeps one home shard", i)
		}
	}
	requireHomes(2)
	require.Eventually(t, func() bool { return s.Shards() == 2 }, time.Minute, 10*time.Millisecond)
	e.fx.SetLive(conformance.TargetB, true) // in the new cluster too
	r0, r1 = e.fx.Read(k0).Snapshot, e.fx.Read(k1).Snapshot
	var id string
	for i := 0; id == ""; i++ {
		c := fmt.Sprintf("homes-%d", i)
		if sharded.PlaceCoordinator(c, schema.ShardMap{Shards: make([]schema.ShardMapShard, 2)}) == 1 {
			id = c
		}
	}
	res0, err := s.PrepareAggregate(ctx, e.request(id, map[authority.Key]*authority.Snapshot{k0: r0, k1: r1}))
	require.NoError(t, err)
	require.Equal(t, authority.KindPrepared, res0.Kind, "%+v", res0)
	f := res0.Fence
	for i, want := range []int64{1, 0} {
		l := schema.NewLayout(cs[i].Namespace)
		resp, err := cs[i].Client.Get(ctx, l.Aggregate(f))
		require.NoError(t, err)
		require.Equal(t, want, resp.Count, "coordinator record of %s in shard %d", id, i)
	}
	grow(t, cs, 2, waits)
	requireHomes(3)
	s3, err := sharded.New(ctx, sharded.Config{Shards: cs[:3], Epoch: 3})
	require.NoError(t, err)
	defer func() { _ = s3.Close() }()
	res, err := s3.CommitAggregate(ctx, f)
	require.NoError(t, err)
	require.Equal(t, authority.KindCommitted, res.Kind)
	payloads(t, s3, map[authority.Key]string{k0: id + ":" + string(k0), k1: id + ":" + string(k1)})
}
