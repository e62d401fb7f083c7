package etcd_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/shardtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/etcd/storeversion"
)

// TestConformanceBeforeFewerKeys runs the conformance suite on a namespace
// at the version before storeversion.FewerKeys, where every row has a
// capacity entry and an owner index entry and every commit a reservation
// terminal (TestConformance runs it at Latest: placement keys, no
// reservation terminal at a commit, compact creation terminals).
func TestConformanceBeforeFewerKeys(t *testing.T) {
	conformance.RunAll(t.Context(), t, func(t *testing.T) *conformance.Harness {
		clock := authority.NewManualClock(testEpoch)
		claims := &shardtest.Claims{}
		s := newStore(t, nil, etcdstore.Config{Namespace: namespaceAt(t, storeversion.FewerKeys-1), Clock: clock, IdentityClaims: claims})
		require.Equal(t, storeversion.FewerKeys-1, s.ActiveVersion())
		h := harnessFor(s, clock)
		h.ClaimIdentity = func(_ testing.TB, key authority.Key) { claims.Claim(key) }
		return h
	})
}

// layoutKeys counts the keys of ns that hold rows and what a row costs:
// rows, capacity entries of the earlier layout, placement keys, owner index
// entries, owner directory keys, reservation terminals and creation
// terminals (by format: "creation terminal" and "compact creation
// terminal").
func layoutKeys(t *testing.T, ns string) map[string]int {
	t.Helper()
	resp, err := shared.Get(context.Background(), ns, clientv3.WithPrefix())
	require.NoError(t, err)
	n := map[string]int{}
	for _, kv := range resp.Kvs {
		e, err := schema.DecodeEntry(ns, kv)
		require.NoError(t, err, "key %s", kv.Key)
		switch {
		case e.Kind == schema.EntryCapacity && e.Capacity.Aggregate:
			n["aggregate capacity"]++
		case e.Kind == schema.EntryCapacity && e.Owner != (authority.OwnerToken{}):
			n["placement key"]++
		case e.Kind == schema.EntryTerminal && kv.Value[0] == 0:
			n["compact creation terminal"]++
		case e.Kind == schema.EntryRow, e.Kind == schema.EntryCapacity, e.Kind == schema.EntryOwnerIndex,
			e.Kind == schema.EntryOwnerNode, e.Kind == schema.EntryReservation, e.Kind == schema.EntryTerminal:
			n[e.Kind.String()]++
		}
	}
	return n
}

// placedRow decodes the stored row at key of ns.
func placedRow(t *testing.T, ns string, key authority.Key) *schema.Row {
	t.Helper()
	resp, err := shared.Get(context.Background(), schema.NewLayout(ns).Row(key))
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1, "row %s", key)
	r, err := schema.DecodeRow(key, resp.Kvs[0])
	require.NoError(t, err)
	return r
}

// TestFewerKeysIsGated: before FewerKeys a Spot costs 4 keys (row, capacity
// entry, owner index entry, reservation terminal) and an Actor 5 (and its
// creation terminal); once finalized, a Spot costs 2 (row, placement key)
// and an Actor 3 (and its compact creation terminal), plus one owner
// directory key per owner and node lifecycle. Rows and terminals of the
// earlier layout keep reading and answering retries.
func TestFewerKeysIsGated(t *testing.T) {
	ctx := context.Background()
	clock := authority.NewManualClock(testEpoch)
	ns := namespaceAt(t, storeversion.FewerKeys-1)
	s := newStore(t, nil, etcdstore.Config{Namespace: ns, Clock: clock})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	create := func(id string) (conformance.Reservation, authority.CompleteCreationResult) {
		spot := fx.Reserve(authority.ObjectUserSpot, id, conformance.TargetA)
		fx.MustCommit(spot, []byte(id+" ready"))
		actor := fx.Reserve(authority.ObjectActor, id, conformance.TargetA)
		return spot, fx.MustComplete(actor, authority.TerminalCreated, []byte(id+" ready"), fx.Publication())
	}
	oldSpot, oldActor := create("old")
	require.Equal(t, map[string]int{"row": 2, "capacity": 2, "owner index": 2, "reservation terminal": 2, "creation terminal": 1},
		layoutKeys(t, ns), "before FewerKeys: 4 keys a Spot, 5 an Actor")

	_, err := s.Finalize(ctx, storeversion.FewerKeys, false)
	require.NoError(t, err)
	newSpot, newActor := create("new")
	require.Equal(t, map[string]int{"row": 4, "capacity": 2, "owner index": 2, "reservation terminal": 2, "creation terminal": 1,
		"placement key": 2, "owner directory": 1, "compact creation terminal": 1},
		layoutKeys(t, ns), "at FewerKeys: 2 keys a Spot, 3 an Actor, one owner directory key for TargetA")
	require.True(t, placedRow(t, ns, newSpot.Key).PlacementKey)
	require.False(t, placedRow(t, ns, oldSpot.Key).PlacementKey)
	require.NotNil(t, placedRow(t, ns, newSpot.Key).Committed, "the committed Spot names its reservation")
	require.Nil(t, placedRow(t, ns, fx.Key(authority.ObjectActor, "new")).Committed, "an Actor is never committed")

	for _, r := range []conformance.Reservation{oldSpot, newSpot} {
		res, err := s.Commit(ctx, r.CommitRequest([]byte("again")))
		require.NoError(t, err)
		require.Equal(t, authority.KindAlreadyCommitted, res.Kind, "retry of %s", r.Key)
	}
	for _, done := range []authority.CompleteCreationResult{oldActor, newActor} {
		read, err := s.ReadCreationTerminal(ctx, done.Terminal.Operation)
		require.NoError(t, err)
		require.Equal(t, authority.KindFound, read.Kind)
		require.Equal(t, done.Terminal.TerminalEnvelope, read.Record.TerminalEnvelope)
		require.Equal(t, done.Terminal.TerminalEnvelopeSHA256, read.Record.TerminalEnvelopeSHA256, "the digest is computed from the envelope")
		require.Equal(t, done.Terminal.ReservationID, read.Record.ReservationID)
		require.True(t, done.Terminal.ExpiresAt.Equal(read.Record.ExpiresAt))
		require.True(t, done.Terminal.StoreNow.Equal(read.Record.StoreNow))
	}
	fx.RequireUsage(conformance.NodeA, authority.ObjectUserSpot, conformance.DefaultStableType, 2, 0)
	fx.RequireUsage(conformance.NodeA, authority.ObjectActor, "", 2, 0)
}

// TestPlacementWriteIsFencedOnTheActiveVersion: a reservation that writes
// a placement key compares the active-version key in its Txn, so once that
// key is no longer the one the store learned its version from, nothing is
// written.
func TestPlacementWriteIsFencedOnTheActiveVersion(t *testing.T) {
	ctx := context.Background()
	clock := authority.NewManualClock(testEpoch)
	ns := namespaceAt(t, storeversion.FewerKeys)
	s := newStore(t, nil, etcdstore.Config{Namespace: ns, Clock: clock})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	before := layoutKeys(t, ns)
	_, err := shared.Delete(ctx, schema.NewLayout(ns).ActiveVersion())
	require.NoError(t, err)
	res, err := s.Reserve(ctx, fx.ReserveRequest(authority.ObjectUserSpot, "unfenced", conformance.TargetA))
	if err == nil {
		require.NotEqual(t, authority.KindReserved, res.Kind)
	}
	require.Equal(t, before, layoutKeys(t, ns), "nothing written")
}

// TestBothLayoutsMoveAndRemove: one owner's rows of both layouts (placed
// before and after finalize) are moved by RebindRows (those of the earlier
// layout take placement keys), moved by an aggregate and removed by
// RemoveAllByOwner; capacity stays exact throughout, and nothing of either
// layout is left behind: no capacity entry, owner index entry or owner
// directory key.
func TestBothLayoutsMoveAndRemove(t *testing.T) {
	ctx := context.Background()
	clock := authority.NewManualClock(testEpoch)
	ns := namespaceAt(t, storeversion.FewerKeys-1)
	s := newStore(t, nil, etcdstore.Config{Namespace: ns, Clock: clock, MaxTxnOps: 16})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	first, err := s.Registry().Acquire(ctx, conformance.NodeA, conformance.NodeLifecycle, "mover", 20*time.Second)
	require.NoError(t, err)
	defer first.Close(ctx)
	firstTarget := conformance.Target(conformance.NodeA, conformance.NodeLifecycle, first.Token())
	const each = 7
	for i := range each {
		fx.Active(authority.ObjectActor, fmt.Sprintf("old-%d", i), firstTarget)
	}
	fx.Reserve(authority.ObjectActor, "old-reserved", firstTarget)
	_, err = s.Finalize(ctx, storeversion.FewerKeys, false)
	require.NoError(t, err)
	for i := range each {
		fx.Active(authority.ObjectActor, fmt.Sprintf("new-%d", i), firstTarget)
	}
	// a CAS keeps a row where it is held
	old0 := fx.Key(authority.ObjectActor, "old-0")
	fx.Put(old0, fx.MustRow(old0).StoreVersion, []byte("put"))
	require.False(t, placedRow(t, ns, old0).PlacementKey)
	keys := layoutKeys(t, ns)
	require.Equal(t, each+1, keys["owner index"])
	require.Equal(t, each, keys["placement key"])

	second, err := s.Registry().Acquire(ctx, conformance.NodeA, conformance.NodeLifecycle, "mover", 20*time.Second)
	require.NoError(t, err)
	defer second.Close(ctx)
	moved, err := second.RebindRows(ctx, first.Token())
	require.NoError(t, err)
	require.EqualValues(t, 2*each, moved)
	keys = layoutKeys(t, ns)
	require.Equal(t, 1, keys["owner index"], "only the reserved row keeps its owner index entry")
	require.Equal(t, 2*each, keys["placement key"], "the rebound rows of the earlier layout take placement keys")
	require.Equal(t, 1, keys["owner directory"], "the old generation's directory key is dropped with its last placement key")
	fx.RequireUsage(conformance.NodeA, authority.ObjectActor, "", 2*each, 1)

	// an aggregate moves a row to another owner and node: its placement
	// key moves, and the target owner's directory names its node
	moveKey := fx.Key(authority.ObjectActor, "old-1")
	row := fx.MustRow(moveKey)
	fence := fx.MustPrepare(conformance.AggregateRequest("mix", 1, conformance.TargetB, row.Allocation.Capacity,
		conformance.Participant(moveKey, row.StoreVersion, authority.TransitionNewOwner, []byte("moved"))))
	res, err := s.CommitAggregate(ctx, fence)
	require.NoError(t, err)
	require.Equal(t, authority.KindCommitted, res.Kind)
	require.Equal(t, 2, layoutKeys(t, ns)["owner directory"])
	fx.RequireUsage(conformance.NodeA, authority.ObjectActor, "", 2*each-1, 1)
	fx.RequireUsage(conformance.NodeB, authority.ObjectActor, "", 1, 0)

	n, err := s.RemoveAllByOwner(ctx, second.Token())
	require.NoError(t, err)
	require.EqualValues(t, 2*each-1, n)
	n, err = s.RemoveAllByOwner(ctx, first.Token())
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "the reserved row of the earlier layout")
	fx.RequireUsage(conformance.NodeA, authority.ObjectActor, "", 0, 0)
	keys = layoutKeys(t, ns)
	require.Equal(t, map[string]int{"row": 1, "placement key": 1, "owner directory": 1, "reservation terminal": each,
		"creation terminal": each, "compact creation terminal": each}, keys,
		"only the row moved to TargetB is left, with its placement key and directory key (and the Actors' terminals until they expire)")
	fx.RequireUsage(conformance.NodeB, authority.ObjectActor, "", 1, 0)
}

// TestDeletedRowKeepsAnsweringItsCommit: from FewerKeys on a commit writes
// no reservation terminal; deleting the row within the retention writes
// it, expiring when the row's answer would have, so a retry still finds
// the reservation committed (and reports whichever row is active at the key
// then, as conformance requires); a row deleted after the retention writes
// none. RemoveAllByOwner does the same for every row it removes.
func TestDeletedRowKeepsAnsweringItsCommit(t *testing.T) {
	ctx := context.Background()
	clock := authority.NewManualClock(testEpoch)
	ns := namespaceAt(t, storeversion.FewerKeys)
	s := newStore(t, nil, etcdstore.Config{Namespace: ns, Clock: clock})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	l := schema.NewLayout(ns)
	terminal := func(id string) *schema.ReservationTerminal {
		t.Helper()
		resp, err := shared.Get(ctx, l.Reservation(id))
		require.NoError(t, err)
		if len(resp.Kvs) == 0 {
			return nil
		}
		require.NotZero(t, resp.Kvs[0].Lease, "a reservation terminal is on a lease")
		rec, err := schema.DecodeReservation(resp.Kvs[0])
		require.NoError(t, err)
		return &rec
	}
	r1 := fx.Reserve(authority.ObjectUserSpot, "s1", conformance.TargetA)
	ready := fx.MustCommit(r1, []byte("ready"))
	require.Nil(t, terminal(r1.Res.ReservationID), "a commit writes no reservation terminal")
	until := placedRow(t, ns, r1.Key).Committed.Until
	require.True(t, until.Equal(clock.Now().Add(s.RecordRetention())))
	clock.Advance(time.Hour)
	fx.Delete(r1.Key, ready.StoreVersion)
	rec := terminal(r1.Res.ReservationID)
	require.NotNil(t, rec, "deleting the row wrote its reservation terminal")
	require.Equal(t, schema.ReservationCommitted, rec.State)
	require.True(t, rec.ExpiresAt.Equal(until), "the terminal ends when the row's answer would have")
	r2 := fx.Reserve(authority.ObjectUserSpot, "s1", conformance.TargetA)
	ready2 := fx.MustCommit(r2, []byte("ready-2"))
	res, err := s.Commit(ctx, r1.CommitRequest([]byte("ready")))
	require.NoError(t, err)
	require.Equal(t, authority.KindAlreadyCommitted, res.Kind)
	conformance.RequireSameRow(t, ready2, res.Ready)

	// after the retention a rewrite drops the ended answer, and a delete
	// writes nothing
	require.NotNil(t, placedRow(t, ns, r2.Key).Committed)
	clock.Advance(s.RecordRetention())
	put := fx.Put(r2.Key, ready2.StoreVersion, []byte("later"))
	require.Nil(t, placedRow(t, ns, r2.Key).Committed, "a rewrite after the retention keeps no ended answer")
	fx.Delete(r2.Key, put.StoreVersion)
	require.Nil(t, terminal(r2.Res.ReservationID))

	// RemoveAllByOwner
	var ids []string
	for i := range 3 {
		r := fx.Reserve(authority.ObjectUserSpot, fmt.Sprintf("rm-%d", i), conformance.TargetA)
		fx.MustCommit(r, []byte("ready"))
		ids = append(ids, r.Res.ReservationID)
	}
	n, err := s.RemoveAllByOwner(ctx, conformance.TargetA.Owner)
	require.NoError(t, err)
	require.EqualValues(t, 3, n)
	for _, id := range ids {
		require.NotNil(t, terminal(id), "RemoveAllByOwner wrote %s's terminal", id)
	}
}

// TestPruneDropsEmptyOwnerDirectories: an owner whose rows on a node
// lifecycle were deleted one by one keeps its directory key there until
// PruneCapacityEpochs deletes it (with the node's epoch, both ranges being
// empty); the owner's next reservation there puts it again.
func TestPruneDropsEmptyOwnerDirectories(t *testing.T) {
	ctx := context.Background()
	clock := authority.NewManualClock(testEpoch)
	ns := namespaceAt(t, storeversion.FewerKeys)
	s := newStore(t, nil, etcdstore.Config{Namespace: ns, Clock: clock})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	row := fx.Active(authority.ObjectUserSpot, "s1", conformance.TargetA)
	fx.Delete(fx.Key(authority.ObjectUserSpot, "s1"), row.StoreVersion)
	require.Equal(t, 1, layoutKeys(t, ns)["owner directory"])
	n, err := s.PruneCapacityEpochs(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, n, "NodeA's epoch and TargetA's directory key")
	require.Zero(t, layoutKeys(t, ns)["owner directory"])
	fx.Reserve(authority.ObjectUserSpot, "s2", conformance.TargetA)
	require.Equal(t, 1, layoutKeys(t, ns)["owner directory"])
	n, err = s.PruneCapacityEpochs(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "a directory with a placement key stays")
	resp, err := shared.Get(ctx, schema.Prefix(ns, schema.EntryOwnerNode), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	require.True(t, strings.HasSuffix(string(resp.Kvs[0].Key), schema.NewLayout("").OwnerNode(conformance.TargetA.Owner, conformance.NodeA, conformance.NodeLifecycle)))
}
