package etcd_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/etcd/storeversion"
)

// lockRow puts a row lock on the row at key, as a cross-shard commit
// attempt does, and returns a func that removes it.
func lockRow(t *testing.T, s *etcdstore.Store, key authority.Key) func() {
	t.Helper()
	lk := schema.NewLayout(s.Namespace()).RowLock(key)
	l := schema.RowLock{Fence: authority.Fence{AggregateID: "elsewhere", AggregateGeneration: 1},
		Incarnation: "0123456789abcdef0123456789abcdef", Attempt: "fedcba9876543210fedcba9876543210", Base: 7}
	_, err := shared.Put(context.Background(), lk, l.Encode())
	require.NoError(t, err)
	return func() {
		_, err := shared.Delete(context.Background(), lk)
		require.NoError(t, err)
	}
}

// requireLocked requires err to be the ErrRowLocked of key.
func requireLocked(t *testing.T, err error, key authority.Key) {
	t.Helper()
	require.ErrorIs(t, err, etcdstore.ErrRowLocked)
	require.ErrorIs(t, err, authority.ErrUnavailable)
	var locked *etcdstore.RowLockedError
	require.ErrorAs(t, err, &locked)
	require.Equal(t, key, locked.Locks[0].Key)
	require.Equal(t, "elsewhere", locked.Locks[0].Lock.Fence.AggregateID)
}

// Every write of an existing row compares the row's lock absent
// (storeversion.RowLocks): with a lock on the row, a compare-exchange of
// each kind, RemoveAllByOwner, RebindRows and an aggregate commit fail with
// ErrRowLocked and write nothing; without it, each goes through.
func TestWritesRespectRowLocks(t *testing.T) {
	ctx := context.Background()
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, nil, etcdstore.Config{Clock: clock})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	row := fx.Active(authority.ObjectActor, "locked", conformance.TargetA)
	key := fx.Key(authority.ObjectActor, "locked")
	unlock := lockRow(t, s, key)
	before := fx.State()

	for name, m := range map[string]authority.Mutation{
		"Put":     authority.Put([]byte("x")),
		"Delete":  authority.Delete(),
		"Restore": {Kind: authority.MutationRestore, ExpectedOwner: conformance.OwnerA, Payload: []byte("r")},
		"Rebind": {Kind: authority.MutationRebindOwnerLease, ExpectedOwner: conformance.OwnerA,
			TargetOwner: authority.OwnerToken{OwnerID: conformance.OwnerA.OwnerID, LeaseGeneration: 2}, Payload: []byte("b")},
	} {
		_, err := s.CompareExchangeAuthority(ctx, key, row.StoreVersion, m)
		requireLocked(t, err, key)
		fx.RequireState(before)
		require.NotEmpty(t, name)
	}
	_, err := s.RemoveAllByOwner(ctx, conformance.OwnerA)
	requireLocked(t, err, key)
	fx.RequireState(before)

	req := conformance.AggregateRequest("plain", 1, conformance.TargetB, authority.CapacityVector{Actors: 1},
		conformance.Participant(key, row.StoreVersion, authority.TransitionNewOwner, []byte("moved")))
	fence := fx.MustPrepare(req) // a prepare writes no row: it does not look at locks
	prepared := fx.State()
	_, err = s.CommitAggregate(ctx, fence)
	requireLocked(t, err, key)
	fx.RequireState(prepared)

	unlock()
	res, err := s.CommitAggregate(ctx, fence)
	require.NoError(t, err)
	require.Equal(t, authority.KindCommitted, res.Kind)
	moved := fx.MustRow(key)
	relock := lockRow(t, s, key)
	n, err := s.RemoveAllByOwner(ctx, conformance.OwnerB)
	requireLocked(t, err, key)
	require.Zero(t, n)
	relock()
	fx.Put(key, moved.StoreVersion, []byte("unlocked"))
}

// RebindRows of a locked row fails with ErrRowLocked and moves nothing;
// without the lock it moves the row.
func TestRebindRowsRespectsRowLocks(t *testing.T) {
	ctx := context.Background()
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, nil, etcdstore.Config{Clock: clock})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	reg := s.Registry()
	first, err := reg.Acquire(ctx, conformance.NodeA, conformance.NodeLifecycle, "mover", 20*time.Second)
	require.NoError(t, err)
	defer first.Close(ctx)
	fx.Active(authority.ObjectActor, "r0", conformance.Target(conformance.NodeA, conformance.NodeLifecycle, first.Token()))
	key := fx.Key(authority.ObjectActor, "r0")
	second, err := reg.Acquire(ctx, conformance.NodeA, conformance.NodeLifecycle, "mover", 20*time.Second)
	require.NoError(t, err)
	defer second.Close(ctx)
	unlock := lockRow(t, s, key)
	n, err := second.RebindRows(ctx, first.Token())
	requireLocked(t, err, key)
	require.Zero(t, n)
	require.Equal(t, first.Token(), fx.MustRow(key).Owner())
	unlock()
	n, err = second.RebindRows(ctx, first.Token())
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	require.Equal(t, second.Token(), fx.MustRow(key).Owner())
}

// The cross-shard writes need the namespace at storeversion.RowLocks: on a
// namespace at the version before, a cross-shard prepare is refused with
// ErrNotFinalized (and ErrInvalidArgument) and writes nothing; finalized,
// it prepares. A store of one cluster refuses to commit or abort a
// cross-shard record (its rows are elsewhere).
func TestCrossShardNeedsRowLocks(t *testing.T) {
	ctx := context.Background()
	ns := namespaceAt(t, storeversion.CompactFormat)
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, nil, etcdstore.Config{Clock: clock, Namespace: ns})
	require.Equal(t, storeversion.CompactFormat, s.ActiveVersion())
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	row := fx.Active(authority.ObjectActor, "a1", conformance.TargetA)
	key := fx.Key(authority.ObjectActor, "a1")
	req := conformance.AggregateRequest("cross", 1, conformance.TargetB, authority.CapacityVector{Actors: 1},
		conformance.Participant(key, row.StoreVersion, authority.TransitionNewOwner, []byte("moved")))
	before := fx.State()
	_, err := s.CrossShard().PrepareCrossShard(ctx, req, nil)
	require.ErrorIs(t, err, etcdstore.ErrNotFinalized)
	require.ErrorIs(t, err, authority.ErrInvalidArgument)
	fx.RequireState(before)
	resp, err := shared.Get(ctx, schema.Prefix(ns, schema.EntryAggregate), clientv3.WithPrefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	require.Zero(t, resp.Count)

	fin, err := s.Finalize(ctx, storeversion.RowLocks, false)
	require.NoError(t, err)
	require.True(t, fin.Moved)
	res, err := s.CrossShard().PrepareCrossShard(ctx, req, nil)
	require.NoError(t, err)
	require.Equal(t, authority.KindPrepared, res.Kind)
	_, err = s.CommitAggregate(ctx, res.Fence)
	require.ErrorIs(t, err, authority.ErrInvalidArgument)
	_, err = s.AbortAggregate(ctx, res.Fence)
	require.ErrorIs(t, err, authority.ErrInvalidArgument)
	rec, err := s.CrossShard().ReadRecord(ctx, res.Fence)
	require.NoError(t, err)
	require.Equal(t, schema.AggregatePrepared, rec.State)
	require.NotEmpty(t, rec.Incarnation)
}
