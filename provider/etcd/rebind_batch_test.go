package etcd_test

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/preflight"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// rebindSetup is a store on client with cfg, a first lease of the owner
// "mover" holding rows active Actors (a0, a1, …) and a second generation
// to rebind onto.
func rebindSetup(t *testing.T, client *clientv3.Client, cfg etcdstore.Config, rows int) (s *etcdstore.Store, fx *conformance.Fixture, first, second *etcdstore.OwnerLease) {
	t.Helper()
	clock := authority.NewManualClock(testEpoch)
	cfg.Clock = clock
	s = newStore(t, client, cfg)
	fx = conformance.NewFixture(t, harnessFor(s, clock))
	ctx := context.Background()
	var err error
	first, err = s.Registry().Acquire(ctx, conformance.NodeA, conformance.NodeLifecycle, "mover", 20*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { _ = first.Close(ctx) })
	tgt := conformance.Target(conformance.NodeA, conformance.NodeLifecycle, first.Token())
	for i := range rows {
		fx.Active(authority.ObjectActor, fmt.Sprintf("a%d", i), tgt)
	}
	second, err = s.Registry().Acquire(ctx, conformance.NodeA, conformance.NodeLifecycle, "mover", 20*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { _ = second.Close(ctx) })
	return s, fx, first, second
}

// ownerIndexKeys is how many rows owner's index names on NodeA: its owner
// index entries and its placement keys there (storeversion.FewerKeys).
func ownerIndexKeys(t *testing.T, s *etcdstore.Store, owner authority.OwnerToken) int64 {
	t.Helper()
	var n int64
	for _, prefix := range ownerIndexPrefixes(s, owner) {
		resp, err := shared.Get(context.Background(), prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		require.NoError(t, err)
		n += resp.Count
	}
	return n
}

// ownerIndexPrefixes are the prefixes of owner's index on NodeA, in either
// layout.
func ownerIndexPrefixes(s *etcdstore.Store, owner authority.OwnerToken) []string {
	return []string{schema.OwnerIndexPrefix(s.Namespace(), owner),
		schema.NewLayout(s.Namespace()).PlacementOwnerPrefix(conformance.NodeA, conformance.NodeLifecycle, owner)}
}

// RebindRows moves many rows a Txn: with --max-txn-ops 32 a Txn moves 10
// rows (3 ops a row, and the node's capacity epoch and the new owner's
// directory key touched once), so 60 rows take 6 Txns (one a row before)
// and one more drops the old owner's directory key if the rebind emptied
// its range (here: a reserved row stays), and each row keeps its payload.
// On etcd 3.7 the old generation's index is streamed a page at a time: no
// read of it is a counted range to its end (each counted the whole rest of
// the index before). Reserved rows stay.
func TestRebindRowsMovesManyRowsATxn(t *testing.T) {
	c := server.Client(t)
	spy := pageSpyKV{KV: c.KV, ranged: &atomic.Int64{}, streams: &atomic.Int64{}, mu: &sync.Mutex{}, ends: new([]string)}
	c.KV = spy
	const rows = 60
	s, fx, first, second := rebindSetup(t, c, etcdstore.Config{MaxTxnOps: 32}, rows)
	oldTgt := conformance.Target(conformance.NodeA, conformance.NodeLifecycle, first.Token())
	fx.Reserve(authority.ObjectActor, "pending", oldTgt)
	before := map[int][]byte{}
	for i := range rows {
		before[i] = fx.MustRow(fx.Key(authority.ObjectActor, fmt.Sprintf("a%d", i))).Payload
	}
	etcdstore.SetOwnerIndexPage(t, 30)
	spy.mu.Lock()
	*spy.ends = nil
	spy.mu.Unlock()
	txns := s.WriteStats().Txns

	moved, err := second.RebindRows(context.Background(), first.Token())
	require.NoError(t, err)
	require.EqualValues(t, rows, moved)
	require.LessOrEqual(t, s.WriteStats().Txns-txns, int64(6+1), "10 rows a Txn")
	for i := range rows {
		snap := fx.MustRow(fx.Key(authority.ObjectActor, fmt.Sprintf("a%d", i)))
		require.Equal(t, second.Token(), snap.Owner(), "row a%d", i)
		require.True(t, bytes.Equal(before[i], snap.Payload), "row a%d payload", i)
	}
	require.EqualValues(t, rows, ownerIndexKeys(t, s, second.Token()))
	require.EqualValues(t, 1, ownerIndexKeys(t, s, first.Token()), "the reservation stays")

	st, err := shared.Status(context.Background(), shared.Endpoints()[0])
	require.NoError(t, err)
	if preflight.ServerVersionAtLeast(st.Version, "3.7.0") {
		spy.mu.Lock()
		defer spy.mu.Unlock()
		for _, prefix := range ownerIndexPrefixes(s, first.Token()) {
			require.NotContains(t, *spy.ends, clientv3.GetPrefixRangeEnd(prefix), "a counted read of the old index to its end")
		}
		require.GreaterOrEqual(t, spy.streams.Load(), int64(2), "2 pages of 30, streamed")
	}
}

// A Txn takes only as many rows as fit --max-request-bytes: rows of 20 KiB
// with a 64 KiB limit move 3 a Txn, and all of them move.
func TestRebindRowsWithinRequestBytes(t *testing.T) {
	const rows = 7
	s, fx, first, second := rebindSetup(t, nil, etcdstore.Config{MaxRequestBytes: 64 << 10}, rows)
	big := bytes.Repeat([]byte("p"), 20<<10)
	for i := range rows {
		key := fx.Key(authority.ObjectActor, fmt.Sprintf("a%d", i))
		res, err := s.CompareExchangeAuthority(context.Background(), key, fx.MustRow(key).StoreVersion, authority.Put(big))
		require.NoError(t, err)
		require.Equal(t, authority.KindStored, res.Kind)
	}
	txns := s.WriteStats().Txns
	moved, err := second.RebindRows(context.Background(), first.Token())
	require.NoError(t, err)
	require.EqualValues(t, rows, moved)
	require.EqualValues(t, 3+1, s.WriteStats().Txns-txns, "3 rows a Txn: 3+3+1, then the old owner's directory key dropped")
	for i := range rows {
		snap := fx.MustRow(fx.Key(authority.ObjectActor, fmt.Sprintf("a%d", i)))
		require.Equal(t, second.Token(), snap.Owner())
		require.True(t, bytes.Equal(big, snap.Payload))
	}
}

// A row removed while its batch is in flight fails the batch's Txn; the
// rows that did not change are sent again and move, and the removed row is
// left to its remover: not counted, not reported.
func TestRebindRowsLeavesRowsChangedUnderIt(t *testing.T) {
	var on atomic.Bool
	c := server.Client(t)
	c.KV = rewritingKV{KV: c.KV, on: &on, only: "/actor/a3", del: true}
	const rows = 8
	_, fx, first, second := rebindSetup(t, c, etcdstore.Config{}, rows)
	on.Store(true)
	moved, err := second.RebindRows(context.Background(), first.Token())
	on.Store(false)
	require.NoError(t, err)
	require.EqualValues(t, rows-1, moved)
	fx.RequireMissing(fx.Key(authority.ObjectActor, "a3"))
	for i := range rows {
		if i != 3 {
			require.Equal(t, second.Token(), fx.MustRow(fx.Key(authority.ObjectActor, fmt.Sprintf("a%d", i))).Owner())
		}
	}
}

// A lease lost while rows move stops the rebind with ErrLeaseLost (its
// liveness compare fails, and Else shows the key gone), counting the rows
// moved before: with --max-txn-ops 16 a Txn moves 4 rows (3 ops a row, and
// the node's capacity epoch and the new generation's directory key once:
// storeversion.FewerKeys), and the liveness key goes just before the second
// Txn (a2 … a5 in key order) is sent.
func TestRebindRowsStopsWhenTheLeaseIsLostMidway(t *testing.T) {
	var on atomic.Bool
	var second *etcdstore.OwnerLease
	var ns string
	c := server.Client(t)
	c.KV = rewritingKV{KV: c.KV, on: &on, only: "/actor/a5", do: func(ctx context.Context, _ string) {
		_, _ = shared.Delete(ctx, schema.OwnerLivenessPrefix(ns, second.Token()), clientv3.WithPrefix())
	}}
	s, fx, first, second := rebindSetup(t, c, etcdstore.Config{MaxTxnOps: 16}, 12)
	ns = s.Namespace()
	on.Store(true)
	moved, err := second.RebindRows(context.Background(), first.Token())
	on.Store(false)
	require.ErrorIs(t, err, etcdstore.ErrLeaseLost)
	require.EqualValues(t, 4, moved)
	require.Equal(t, second.Token(), fx.MustRow(fx.Key(authority.ObjectActor, "a0")).Owner())
	require.Equal(t, first.Token(), fx.MustRow(fx.Key(authority.ObjectActor, "a5")).Owner())
}

// A lease of the next generation on another node than the rows' cannot
// take them (each row's write compares the new owner's liveness on the
// row's node): RebindRows says so with ErrInvalidArgument and moves none,
// instead of reporting the lease lost or retryable contention.
func TestRebindRowsOntoALeaseOfAnotherNode(t *testing.T) {
	s, fx, first, _ := rebindSetup(t, nil, etcdstore.Config{}, 3)
	ctx := context.Background()
	other, err := s.Registry().Acquire(ctx, conformance.NodeB, conformance.NodeLifecycle, "mover", 20*time.Second)
	require.NoError(t, err)
	defer other.Close(ctx)
	moved, err := other.RebindRows(ctx, first.Token())
	require.ErrorIs(t, err, authority.ErrInvalidArgument)
	require.NotErrorIs(t, err, etcdstore.ErrLeaseLost)
	require.Contains(t, err.Error(), "node-a")
	require.Zero(t, moved)
	require.Equal(t, first.Token(), fx.MustRow(fx.Key(authority.ObjectActor, "a0")).Owner())
}

// RebindRows moves the rows of an earlier generation of its own owner only:
// a lease of the owner "thief" given the token of a live owner "victim" on
// the same node, its own token, a later generation of its owner or a token
// with no owner is refused with ErrInvalidArgument naming the rule, before
// any write (the store's revision does not move) and without a panic; the
// victim's rows stay its own.
func TestRebindRowsRefusesATokenNotAnEarlierGenerationOfItsOwner(t *testing.T) {
	s, fx, victim, _ := rebindSetup(t, nil, etcdstore.Config{}, 3)
	ctx := context.Background()
	thief, err := s.Registry().Acquire(ctx, conformance.NodeA, conformance.NodeLifecycle, "thief", 20*time.Second)
	require.NoError(t, err)
	defer thief.Close(ctx)
	later, err := s.Registry().Acquire(ctx, conformance.NodeA, conformance.NodeLifecycle, "thief", 20*time.Second)
	require.NoError(t, err)
	defer later.Close(ctx)
	for name, from := range map[string]authority.OwnerToken{
		"another owner's live token": victim.Token(),
		"its own token":              thief.Token(),
		"a later generation":         later.Token(),
		"generation 0":               {OwnerID: "thief"},
		"no owner":                   {LeaseGeneration: 1},
	} {
		t.Run(name, func(t *testing.T) {
			before := namespaceWrites(t, s)
			moved, err := thief.RebindRows(ctx, from)
			require.ErrorIs(t, err, authority.ErrInvalidArgument)
			require.Zero(t, moved)
			require.Equal(t, before, namespaceWrites(t, s), "nothing written")
			for i := range 3 {
				require.Equal(t, victim.Token(), fx.MustRow(fx.Key(authority.ObjectActor, fmt.Sprintf("a%d", i))).Owner())
			}
		})
	}
	moved, err := thief.RebindRows(ctx, victim.Token())
	require.ErrorContains(t, err, "earlier lease generation of its own owner")
	require.Zero(t, moved)
}

// namespaceWrites fingerprints what s's namespace holds: how many keys and
// the newest ModRevision among them (a write anywhere in it changes one of
// the two). It reads inside the namespace only, so it also holds on a
// shared external cluster where others write.
func namespaceWrites(t *testing.T, s *etcdstore.Store) [2]int64 {
	t.Helper()
	resp, err := shared.Get(context.Background(), s.Namespace(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	require.NoError(t, err)
	var newest int64
	for _, kv := range resp.Kvs {
		newest = max(newest, kv.ModRevision)
	}
	return [2]int64{int64(len(resp.Kvs)), newest}
}

// Rows stay on the node lifecycle they were placed on: RebindRows onto a
// lease of the same node at another lifecycle (a node that started a new
// lifecycle) refuses the rows of lifecycle 1 with ErrInvalidArgument naming
// both lifecycles and both ways on (a lease on lifecycle 1, or an
// aggregate), writing nothing; that aggregate then moves them onto
// lifecycle 2, with their capacity (README, "Node lifecycles and lease
// generations").
func TestRebindRowsOntoAnotherLifecycleNamesBoth(t *testing.T) {
	const rows = 3
	s, fx, first, _ := rebindSetup(t, nil, etcdstore.Config{}, rows)
	ctx := context.Background()
	restarted, err := s.Registry().Acquire(ctx, conformance.NodeA, conformance.NodeLifecycle+1, "mover", 20*time.Second)
	require.NoError(t, err)
	defer restarted.Close(ctx)
	before := namespaceWrites(t, s)
	moved, err := restarted.RebindRows(ctx, first.Token())
	require.ErrorIs(t, err, authority.ErrInvalidArgument)
	require.NotErrorIs(t, err, etcdstore.ErrLeaseLost)
	require.Zero(t, moved)
	for _, part := range []string{"at node lifecycle 1", "this lease at lifecycle 2", "acquire the new generation on lifecycle 1", "aggregate"} {
		require.Contains(t, err.Error(), part)
	}
	require.Equal(t, before, namespaceWrites(t, s), "nothing written")

	// the documented way: one aggregate moves them onto the new lifecycle
	var parts []authority.AggregateParticipant
	for i := range rows {
		key := fx.Key(authority.ObjectActor, fmt.Sprintf("a%d", i))
		parts = append(parts, conformance.Participant(key, fx.MustRow(key).StoreVersion, authority.TransitionNewOwner, []byte("moved")))
	}
	newRun := conformance.Target(conformance.NodeA, conformance.NodeLifecycle+1, restarted.Token())
	fence := fx.MustPrepare(conformance.AggregateRequest("restart/mover", first.Token().LeaseGeneration, newRun, authority.CapacityVector{Actors: rows}, parts...))
	committed, err := s.CommitAggregate(ctx, fence)
	require.NoError(t, err)
	require.Equal(t, authority.KindCommitted, committed.Kind)
	for i := range rows {
		snap := fx.MustRow(fx.Key(authority.ObjectActor, fmt.Sprintf("a%d", i)))
		require.Equal(t, restarted.Token(), snap.Owner())
		require.EqualValues(t, conformance.NodeLifecycle+1, snap.Allocation.DescriptorLifecycleGeneration)
	}
	for lifecycle, want := range map[int64]int64{conformance.NodeLifecycle: 0, conformance.NodeLifecycle + 1: rows} {
		use, err := s.CapacityUsage(ctx, conformance.NodeA, lifecycle, authority.ObjectActor, "")
		require.NoError(t, err)
		require.Equal(t, want, use.Active, "lifecycle %d", lifecycle)
	}
}

// A row read held by from that another writer moves to another owner
// before the rebind's Txn applies is never moved: its ModRevision compare
// (the Txn's owner fence) fails, and from what Else read the row is no
// longer from's. The other rows of the Txn move.
func TestRebindRowsNeverMovesARowThatLeftFrom(t *testing.T) {
	var on atomic.Bool
	var once sync.Once
	var third authority.OwnerToken
	var other *etcdstore.Store
	var first *etcdstore.OwnerLease
	c := server.Client(t)
	c.KV = rewritingKV{KV: c.KV, on: &on, only: "/actor/a2", do: func(ctx context.Context, _ string) {
		once.Do(func() {
			key := authority.Key("actor/a2")
			cur, err := other.ReadAuthority(ctx, key)
			require.NoError(t, err)
			res, err := other.CompareExchangeAuthority(ctx, key, cur.Snapshot.StoreVersion, authority.RebindOwnerLease(first.Token(), third, []byte("taken")))
			require.NoError(t, err)
			require.Equal(t, authority.KindStored, res.Kind)
		})
	}}
	const rows = 4
	s, fx, first, second := rebindSetup(t, c, etcdstore.Config{}, rows)
	ctx := context.Background()
	other = newStore(t, nil, etcdstore.Config{Namespace: s.Namespace()})
	lease3, err := other.Registry().Acquire(ctx, conformance.NodeA, conformance.NodeLifecycle, "mover", 20*time.Second)
	require.NoError(t, err)
	defer lease3.Close(ctx)
	third = lease3.Token()
	on.Store(true)
	moved, err := second.RebindRows(ctx, first.Token())
	on.Store(false)
	require.NoError(t, err)
	require.EqualValues(t, rows-1, moved)
	require.Equal(t, third, fx.MustRow(fx.Key(authority.ObjectActor, "a2")).Owner(), "the row that left from stays with its new owner")
	for _, i := range []int{0, 1, 3} {
		require.Equal(t, second.Token(), fx.MustRow(fx.Key(authority.ObjectActor, fmt.Sprintf("a%d", i))).Owner())
	}
}
