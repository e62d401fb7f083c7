package etcd_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/etcd/storeversion"
)

// changesUnder returns the keys of every change under ns after revision
// from, read back with a watch up to a sentinel key put there last.
func changesUnder(t *testing.T, ns string, from int64) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sentinel := ns + "~sentinel"
	_, err := shared.Put(ctx, sentinel, "")
	require.NoError(t, err)
	defer func() { _, _ = shared.Delete(context.Background(), sentinel) }()
	var keys []string
	for wr := range shared.Watch(ctx, ns, clientv3.WithPrefix(), clientv3.WithRev(from+1)) {
		require.NoError(t, wr.Err())
		for _, ev := range wr.Events {
			if string(ev.Kv.Key) == sentinel {
				return keys
			}
			keys = append(keys, string(ev.Kv.Key))
		}
	}
	t.Fatalf("the watch under %s ended before the sentinel: %v", ns, ctx.Err())
	return nil
}

// requireReadOnly checks that err is a read-only store's refusal.
func requireReadOnly(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, etcdstore.ErrReadOnly) || !errors.Is(err, authority.ErrAccessDenied) {
		t.Fatalf("%s on a read-only store: %v, want ErrReadOnly and ErrAccessDenied", what, err)
	}
}

// TestReadOnlyStoreWritesNothing: a read-only store on an unused namespace
// neither bootstraps its version nor announces itself, reads it at Base,
// and refuses every write before it is sent; nothing changes under the
// namespace from its New to its Close.
func TestReadOnlyStoreWritesNothing(t *testing.T) {
	ctx := context.Background()
	ns := etcdtest.Namespace()
	start, err := shared.Get(ctx, ns)
	require.NoError(t, err)
	clock := authority.NewManualClock(testEpoch)
	s, err := etcdstore.New(ctx, etcdstore.Config{Client: shared, Namespace: ns, ReadOnly: true, Clock: clock})
	require.NoError(t, err)
	defer func() { _ = s.Close() }()
	require.Equal(t, storeversion.Base, s.ActiveVersion(), "an unused namespace read only is at Base")
	u, err := s.UpgradeStatus(ctx)
	require.NoError(t, err)
	require.Empty(t, u.Announced, "a read-only store announces nothing")
	dry, err := s.Finalize(ctx, storeversion.Latest, true)
	require.NoError(t, err, "a dry-run finalize only reads")
	require.Equal(t, storeversion.Latest, dry.To)

	h := harnessFor(s, clock)
	h.SetLive = func(testing.TB, authority.NodeDescriptor, int64, authority.OwnerToken, bool) {} // it would write
	fx := conformance.NewFixture(t, h)
	owner := authority.OwnerToken{OwnerID: "reader", LeaseGeneration: 1}
	tgt := conformance.Target(conformance.NodeA, conformance.NodeLifecycle, owner)
	_, err = s.Reserve(ctx, fx.ReserveRequest(authority.ObjectActor, "a", tgt))
	requireReadOnly(t, "Reserve", err)
	_, err = s.RemoveAllByOwner(ctx, owner)
	requireReadOnly(t, "RemoveAllByOwner", err)
	requireReadOnly(t, "MarkLive", s.MarkLive(ctx, conformance.NodeA, 1, owner, time.Minute))
	_, err = s.Registry().Acquire(ctx, conformance.NodeA, 1, "reader", time.Minute)
	requireReadOnly(t, "Registry.Acquire", err)
	_, err = s.Finalize(ctx, storeversion.Latest, false)
	requireReadOnly(t, "Finalize", err)
	_, err = s.Relocation().PutNew(ctx, []byte("recovery"), time.Minute)
	requireReadOnly(t, "Relocation.PutNew", err)
	_, err = s.PruneCapacityEpochs(ctx)
	requireReadOnly(t, "PruneCapacityEpochs", err)
	requireReadOnly(t, "MarkDead", s.MarkDead(ctx, conformance.NodeA, 1, owner))
	requireReadOnly(t, "Relocation.Delete", s.Relocation().Delete(ctx, "no-such-blob"))
	// refused whatever the request: an empty one is not even validated
	_, err = s.Commit(ctx, authority.CommitRequest{})
	requireReadOnly(t, "Commit", err)
	_, err = s.CompleteCreation(ctx, authority.CompleteCreationRequest{})
	requireReadOnly(t, "CompleteCreation", err)
	_, err = s.Abort(ctx, authority.AbortRequest{})
	requireReadOnly(t, "Abort", err)
	_, err = s.PrepareAggregate(ctx, authority.AggregatePrepareRequest{})
	requireReadOnly(t, "PrepareAggregate", err)
	_, err = s.CommitAggregate(ctx, authority.Fence{})
	requireReadOnly(t, "CommitAggregate", err)
	_, err = s.AbortAggregate(ctx, authority.Fence{})
	requireReadOnly(t, "AbortAggregate", err)
	require.NoError(t, s.Close())

	got, err := shared.Get(ctx, ns, clientv3.WithPrefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	require.Zero(t, got.Count, "keys left under %s", ns)
	require.Empty(t, changesUnder(t, ns, start.Header.Revision), "a read-only store wrote under %s", ns)
}

// TestReadOnlyStoreReadsAndFollowsTheVersion: a read-only store reads the
// rows a writer put, at the namespace's active version, and follows a
// finalize; on a namespace finalized past this build it refuses to open,
// as a writer does.
func TestReadOnlyStoreReadsAndFollowsTheVersion(t *testing.T) {
	ctx := context.Background()
	ns := earlierBuildNamespace(t)
	clock := authority.NewManualClock(testEpoch)
	w := newStore(t, nil, etcdstore.Config{Namespace: ns, Clock: clock})
	fx := conformance.NewFixture(t, harnessFor(w, clock))
	owner := authority.OwnerToken{OwnerID: "writer", LeaseGeneration: 1}
	key := fx.Key(authority.ObjectActor, "a")
	tgt := conformance.Target(conformance.NodeA, conformance.NodeLifecycle, owner)
	fx.SetLive(tgt, true)
	row := fx.Active(authority.ObjectActor, "a", tgt)

	r, err := etcdstore.New(ctx, etcdstore.Config{Client: shared, Namespace: ns, ReadOnly: true})
	require.NoError(t, err)
	defer func() { _ = r.Close() }()
	require.Equal(t, storeversion.Base, r.ActiveVersion())
	got, err := r.ReadAuthority(ctx, key)
	require.NoError(t, err)
	require.Equal(t, authority.KindSnapshot, got.Kind)
	conformance.RequireSameRow(t, row, got.Snapshot)
	_, err = r.CompareExchangeAuthority(ctx, key, row.StoreVersion, authority.Delete())
	requireReadOnly(t, "CompareExchangeAuthority", err)
	fx.MustRow(key)

	_, err = w.Finalize(ctx, storeversion.Latest, false)
	require.NoError(t, err)
	waitFor(t, "the read-only store to follow the finalize", func() bool { return r.ActiveVersion() == storeversion.Latest })

	later := etcdtest.Namespace()
	t.Cleanup(func() { _, _ = shared.Delete(context.Background(), later, clientv3.WithPrefix()) })
	_, err = shared.Put(ctx, schema.NewLayout(later).ActiveVersion(), schema.EncodeActiveVersion(99))
	require.NoError(t, err)
	if s, err := etcdstore.New(ctx, etcdstore.Config{Client: shared, Namespace: later, ReadOnly: true}); !errors.Is(err, etcdstore.ErrVersionSkew) {
		if s != nil {
			_ = s.Close()
		}
		t.Fatalf("a read-only store on a namespace at version 99: %v, want ErrVersionSkew", err)
	}
}

// TestReadOnlyCapacityUsageLeavesEpochsAlone: on capacity entries an
// earlier build wrote without their node's epoch, a writer's CapacityUsage
// puts the epoch first (deviation E24); a read-only store sums the entries
// and puts nothing.
func TestReadOnlyCapacityUsageLeavesEpochsAlone(t *testing.T) {
	ctx := context.Background()
	clock := authority.NewManualClock(testEpoch)
	w := newStore(t, nil, etcdstore.Config{Clock: clock})
	fx := conformance.NewFixture(t, harnessFor(w, clock))
	fx.Reserve(authority.ObjectActor, "held", conformance.TargetA)
	ns := w.Namespace()
	_, err := shared.Delete(ctx, ns+"capacity-epochs/", clientv3.WithPrefix())
	require.NoError(t, err)
	r, err := etcdstore.New(ctx, etcdstore.Config{Client: shared, Namespace: ns, ReadOnly: true, Clock: clock})
	require.NoError(t, err)
	defer func() { _ = r.Close() }()
	got, err := r.CapacityUsage(ctx, conformance.NodeA, conformance.NodeLifecycle, authority.ObjectActor, "")
	require.NoError(t, err)
	require.Equal(t, authority.CapacityUsage{Reserved: 1}, got)
	require.Empty(t, epochLifecycles(t, ns), "a read-only store put a capacity epoch")
}

// TestReadOnlyReadLeavesExpiredRecords: a writer that reads an expired
// relocation blob deletes it (as the seed's read does); a read-only store
// answers missing too, and leaves the record to its lease.
func TestReadOnlyReadLeavesExpiredRecords(t *testing.T) {
	ctx := context.Background()
	clock := authority.NewManualClock(testEpoch)
	w := newStore(t, nil, etcdstore.Config{Clock: clock})
	receipt, err := w.Relocation().PutNew(ctx, []byte("recovery"), time.Minute)
	require.NoError(t, err)
	clock.Advance(2 * time.Minute)
	ns := w.Namespace()
	before, err := shared.Get(ctx, ns, clientv3.WithPrefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	r, err := etcdstore.New(ctx, etcdstore.Config{Client: shared, Namespace: ns, ReadOnly: true, Clock: clock})
	require.NoError(t, err)
	defer func() { _ = r.Close() }()
	got, err := r.Relocation().Read(ctx, receipt.Reference)
	require.NoError(t, err)
	require.Equal(t, authority.KindMissing, got.Kind)
	after, err := shared.Get(ctx, ns, clientv3.WithPrefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	require.Equal(t, before.Count, after.Count, "a read-only read deleted the expired blob")
}
