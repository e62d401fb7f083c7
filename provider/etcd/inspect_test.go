package etcd_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/etcd/storeversion"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// inspected is a store holding every kind of entry, written through its API.
type inspected struct {
	s     *etcdstore.Store
	clock *authority.ManualClock
	fx    *conformance.Fixture
	lease *etcdstore.OwnerLease
	// reservations is the reservation terminal state each reservation ends in.
	reservations map[string]string
	// terminals are the published creation terminals.
	terminals []*authority.TerminalRecord
	// aggregates is the state each aggregate ends in, and its request.
	aggregates map[authority.Fence]string
	requests   map[authority.Fence]authority.AggregatePrepareRequest
	blob       authority.BlobReceipt
	blobData   []byte
}

// newInspected writes its first rows and records in a namespace at the
// version before storeversion.FewerKeys (capacity entries with owner index
// entries, reservation terminals, format-1 creation terminals), then
// finalizes it and writes the rest (placement keys, owner directory keys,
// compact creation terminals): every kind of entry of both layouts.
func newInspected(t *testing.T) *inspected {
	t.Helper()
	ctx := context.Background()
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, nil, etcdstore.Config{Clock: clock, Namespace: namespaceAt(t, storeversion.FewerKeys-1)})
	fx := conformance.NewFixture(t, harnessFor(s, clock)) // MarkLive of TargetA and TargetB
	in := &inspected{s: s, clock: clock, fx: fx, reservations: map[string]string{},
		aggregates: map[authority.Fence]string{}, requests: map[authority.Fence]authority.AggregatePrepareRequest{}}

	lease, err := s.Registry().Acquire(ctx, authority.NodeDescriptor{MeshName: "mesh-1", RID: "node c/é"}, 3, "owner c/é", time.Minute)
	require.NoError(t, err)
	t.Cleanup(func() { _ = lease.Close(context.Background()) })
	in.lease = lease

	// Spots: committed, still reserved, aborted.
	r := fx.Reserve(authority.ObjectUserSpot, "spot-1", conformance.TargetA)
	fx.MustCommit(r, []byte("spot-1 ready"))
	in.reservations[r.Res.ReservationID] = schema.ReservationCommitted
	fx.Reserve(authority.ObjectInstanceSpot, "spot-2", conformance.TargetB)
	r = fx.Reserve(authority.ObjectUserSpot, "spot-3", conformance.TargetA)
	ab, err := s.Abort(ctx, r.AbortRequest())
	require.NoError(t, err)
	require.Equal(t, authority.KindAborted, ab.Kind)
	in.reservations[r.Res.ReservationID] = schema.ReservationAborted

	// Actors: created and rejected, each publishing a terminal.
	for id, kind := range map[string]authority.CompletionKind{"actor-1": authority.TerminalCreated, "actor-2": authority.TerminalRejected} {
		r := fx.Reserve(authority.ObjectActor, id, conformance.TargetA)
		done := fx.MustComplete(r, kind, []byte(id+" ready"), fx.Publication())
		require.NotNil(t, done.Terminal)
		in.terminals = append(in.terminals, done.Terminal)
		want := schema.ReservationCommitted
		if kind != authority.TerminalCreated {
			want = string(kind)
		}
		in.reservations[r.Res.ReservationID] = want
	}

	// from here on, the layout of FewerKeys: a Spot and an Actor leave no
	// reservation terminal
	_, err = s.Finalize(ctx, storeversion.Latest, false)
	require.NoError(t, err)
	fx.MustCommit(fx.Reserve(authority.ObjectUserSpot, "spot-4", conformance.TargetA), []byte("spot-4 ready"))
	done := fx.MustComplete(fx.Reserve(authority.ObjectActor, "actor-3", conformance.TargetA), authority.TerminalCreated, []byte("actor-3 ready"), fx.Publication())
	in.terminals = append(in.terminals, done.Terminal)

	// Aggregates: committed, prepared, aborted.
	for i, end := range []string{schema.AggregateCommitted, schema.AggregatePrepared, schema.AggregateAborted} {
		id := []string{"move/1", "move 2", "move-3"}[i]
		r := fx.Reserve(authority.ObjectUserSpot, "mover-"+id, conformance.TargetA)
		a := fx.MustCommit(r, []byte("ready"))
		req := conformance.AggregateRequest(id, int64(i+1), conformance.TargetB, a.Allocation.Capacity,
			conformance.Participant(r.Key, a.StoreVersion, authority.TransitionNewOwner, []byte("moved")))
		prep, err := s.PrepareAggregate(ctx, req)
		require.NoError(t, err)
		require.Equal(t, authority.KindPrepared, prep.Kind)
		switch end {
		case schema.AggregateCommitted:
			res, err := s.CommitAggregate(ctx, prep.Fence)
			require.NoError(t, err)
			require.Equal(t, authority.KindCommitted, res.Kind)
		case schema.AggregateAborted:
			res, err := s.AbortAggregate(ctx, prep.Fence)
			require.NoError(t, err)
			require.Equal(t, authority.KindAborted, res.Kind)
		}
		in.aggregates[prep.Fence] = end
		in.requests[prep.Fence] = req
	}

	in.blobData = []byte("relocation blob \x00\xff")
	in.blob, err = s.Relocation().PutNew(ctx, in.blobData, time.Minute)
	require.NoError(t, err)
	return in
}

// decodeAll ranges the store's namespace raw and decodes every key.
func (in *inspected) decodeAll(t *testing.T) ([]schema.Entry, []*mvccpb.KeyValue) {
	t.Helper()
	ns := in.s.Namespace()
	resp, err := shared.Get(context.Background(), ns, clientv3.WithPrefix())
	require.NoError(t, err)
	out := make([]schema.Entry, len(resp.Kvs))
	for i, kv := range resp.Kvs {
		e, err := schema.DecodeEntry(ns, kv)
		require.NoError(t, err, "key %q", kv.Key)
		require.NotEqual(t, schema.EntryUnknown, e.Kind, "key %q", kv.Key)
		require.True(t, strings.HasPrefix(string(kv.Key), schema.Prefix(ns, e.Kind)), "key %q is no %s", kv.Key, e.Kind)
		out[i] = e
	}
	return out, resp.Kvs
}

func TestInspectDecodeEntryMatchesStore(t *testing.T) {
	in := newInspected(t)
	ctx := context.Background()
	s, ns := in.s, in.s.Namespace()
	entries, kvs := in.decodeAll(t)

	seen := map[schema.EntryKind]int{}
	type counterKey struct {
		node      authority.NodeDescriptor
		lifecycle int64
		kind      authority.ObjectKind
		stable    string
	}
	usage := map[counterKey]*authority.CapacityUsage{}
	var rowKeys []authority.Key
	indexed := map[authority.Key]authority.OwnerToken{}
	reservations := map[string]string{}
	var terminals []*authority.TerminalRecord
	aggregates := map[authority.Fence]string{}
	lives := map[authority.OwnerToken]bool{}
	type nodeKey struct {
		node      authority.NodeDescriptor
		lifecycle int64
	}
	lastEntry := map[nodeKey]int64{} // the newest capacity entry's ModRevision, per node
	epochs := map[nodeKey]int64{}
	type nodeOwner struct {
		nodeKey
		owner authority.OwnerToken
	}
	directories, placements := map[nodeOwner]bool{}, map[nodeOwner]bool{}
	for i, e := range entries {
		kv := kvs[i]
		seen[e.Kind]++
		switch e.Kind {
		case schema.EntryRow:
			read, err := s.ReadAuthority(ctx, e.Key)
			require.NoError(t, err)
			require.Equal(t, authority.KindSnapshot, read.Kind)
			want := *read.Snapshot
			want.StoreNow = time.Time{}
			require.Equal(t, &want, e.Snapshot, "row %s", e.Key)
			rowKeys = append(rowKeys, e.Key)
		case schema.EntryOwnerLiveness:
			live, err := s.IsTargetLive(ctx, e.Node, e.Lifecycle, e.Owner)
			require.NoError(t, err)
			require.True(t, live, "%+v", e)
			require.True(t, strings.HasPrefix(string(kv.Key), schema.OwnerLivenessPrefix(ns, e.Owner)))
			require.NotZero(t, kv.Lease)
			lives[e.Owner] = true
		case schema.EntryOwnerGeneration:
			require.Equal(t, in.lease.Token(), e.Owner)
		case schema.EntryOwnerIndex:
			require.True(t, strings.HasPrefix(string(kv.Key), schema.OwnerIndexPrefix(ns, e.Owner)))
			indexed[e.Key] = e.Owner
		case schema.EntryOwnerNode:
			placed, err := shared.Get(ctx, schema.NewLayout(ns).PlacementOwnerPrefix(e.Node, e.Lifecycle, e.Owner), clientv3.WithPrefix(), clientv3.WithCountOnly())
			require.NoError(t, err)
			require.NotZero(t, placed.Count, "owner directory %+v names no placement key", e)
			directories[nodeOwner{nodeKey{e.Node, e.Lifecycle}, e.Owner}] = true
		case schema.EntryCapacity:
			if e.Owner != (authority.OwnerToken{}) { // a placement key: also the row's owner index
				indexed[e.Key] = e.Owner
				placements[nodeOwner{nodeKey{e.Node, e.Lifecycle}, e.Owner}] = true
			}
			lastEntry[nodeKey{e.Node, e.Lifecycle}] = max(lastEntry[nodeKey{e.Node, e.Lifecycle}], kv.ModRevision)
			for _, c := range authority.CapacityEntries(e.Node, e.Lifecycle, e.Capacity.Vector) {
				k := counterKey{e.Node, e.Lifecycle, c.Counter.ObjectKind, c.Counter.StableType}
				if usage[k] == nil {
					usage[k] = &authority.CapacityUsage{}
				}
				if e.Capacity.State == authority.AllocationActive {
					usage[k].Active += c.Count
				} else {
					usage[k].Reserved += c.Count
				}
			}
			if e.Capacity.Aggregate {
				require.Equal(t, schema.AggregatePrepared, in.aggregates[e.Fence], "capacity of %+v", e.Fence)
				require.Equal(t, in.requests[e.Fence].Capacity, e.Capacity.Vector)
				require.Equal(t, authority.AllocationReserved, e.Capacity.State)
				require.Equal(t, conformance.NodeB, e.Node)
				continue
			}
			row := in.fx.MustRow(e.Key)
			require.Equal(t, row.Allocation.State, e.Capacity.State, "capacity of %s", e.Key)
			require.Equal(t, row.Allocation.Capacity, e.Capacity.Vector)
			require.Equal(t, row.Allocation.Descriptor, e.Node)
			require.Equal(t, row.Allocation.DescriptorLifecycleGeneration, e.Lifecycle)
		case schema.EntryReservation:
			require.False(t, e.Expired(in.clock.Now()))
			require.True(t, e.Reservation.ExpiresAt.Equal(in.clock.Now().Add(s.RecordRetention())))
			reservations[e.ReservationID] = e.Reservation.State
		case schema.EntryTerminal:
			read, err := s.ReadCreationTerminal(ctx, e.Terminal.Operation)
			require.NoError(t, err)
			require.Equal(t, authority.KindFound, read.Kind)
			require.Equal(t, read.Record, e.Terminal)
			require.False(t, e.Expired(in.clock.Now()))
			terminals = append(terminals, e.Terminal)
		case schema.EntryAggregate:
			aggregates[e.Fence] = e.Aggregate.State
			want := in.requests[e.Fence]
			if e.Aggregate.State != schema.AggregatePrepared {
				// a finished record keeps no payloads or membership mutations
				want.Participants = slices.Clone(want.Participants)
				for i := range want.Participants {
					want.Participants[i].AuthorityPayload, want.Participants[i].MembershipMutation = nil, nil
				}
			}
			require.Equal(t, want, e.Aggregate.Request)
			require.Equal(t, e.Aggregate.State == schema.AggregatePrepared, e.Aggregate.ExpiresAt.IsZero())
			require.False(t, e.Expired(in.clock.Now()))
		case schema.EntryCapacityEpoch:
			epochs[nodeKey{e.Node, e.Lifecycle}] = kv.ModRevision
		case schema.EntryBlob:
			require.Equal(t, in.blob.Reference, e.BlobReference)
			require.Equal(t, in.blobData, e.Blob.Data)
			require.True(t, in.blob.ExpiresAt.Equal(e.Blob.ExpiresAt))
			read, err := s.Relocation().Read(ctx, e.BlobReference)
			require.NoError(t, err)
			require.Equal(t, read.Bytes, e.Blob.Data)
		}
	}
	// every kind a single store writes (escrow keys, row locks, part markers
	// and the shard map are a sharded store's)
	for k := schema.EntryRow; k <= schema.EntryOwnerNode; k++ {
		switch k {
		case schema.EntryEscrow, schema.EntryRowLock, schema.EntryAggregatePart, schema.EntryShardMap:
			continue
		}
		require.NotZero(t, seen[k], "no %s entry", k)
	}
	// every owner with placement keys on a node lifecycle has its directory key there
	require.Equal(t, placements, directories)
	// every capacity entry was written with its node's epoch
	for n, rev := range lastEntry {
		require.GreaterOrEqual(t, epochs[n], rev, "capacity epoch of %+v", n)
	}

	// rows: exactly the rows ListAuthorities lists, each in the owner index
	page, err := s.ListAuthorities(ctx, "", "", authority.MaxScanLimit)
	require.NoError(t, err)
	var listed []authority.Key
	for _, it := range page.Items {
		listed = append(listed, it.Key)
		require.Equal(t, it.Snapshot.Owner(), indexed[it.Key], "owner index of %s", it.Key)
	}
	require.Equal(t, listed, rowKeys)
	require.Len(t, indexed, len(rowKeys))

	// capacity: the sums of the entries are CapacityUsage's
	require.NotEmpty(t, usage)
	for k, u := range usage {
		got, err := s.CapacityUsage(ctx, k.node, k.lifecycle, k.kind, k.stable)
		require.NoError(t, err)
		require.Equal(t, got, *u, "usage of %+v", k)
	}

	require.Equal(t, in.reservations, reservations)
	require.ElementsMatch(t, in.terminals, terminals)
	require.Equal(t, in.aggregates, aggregates)
	require.Equal(t, map[authority.OwnerToken]bool{conformance.OwnerA: true, conformance.OwnerB: true, in.lease.Token(): true}, lives)
}

func TestInspectExpired(t *testing.T) {
	in := newInspected(t)
	entries, _ := in.decodeAll(t)
	latest := in.clock.Now()
	for _, e := range entries { // the last expiry
		if at, ok := e.Expiry(); ok && at.After(latest) {
			latest = at
		}
	}
	in.clock.Advance(latest.Sub(in.clock.Now()))
	now := in.clock.Now()
	ctx := context.Background()
	for _, e := range entries {
		expires := e.Reservation != nil || e.Terminal != nil || e.Blob != nil ||
			e.Aggregate != nil && e.Aggregate.State != schema.AggregatePrepared
		require.Equal(t, expires, e.Expired(now), "%s %+v", e.Kind, e)
		require.False(t, e.Expired(now.Add(-time.Hour*24*365)), "%s", e.Kind)
		switch {
		case e.Terminal != nil: // the store agrees: no longer served
			read, err := in.s.ReadCreationTerminal(ctx, e.Terminal.Operation)
			require.NoError(t, err)
			require.Equal(t, authority.KindMissing, read.Kind)
		case e.Blob != nil:
			read, err := in.s.Relocation().Read(ctx, e.BlobReference)
			require.NoError(t, err)
			require.Equal(t, authority.KindMissing, read.Kind)
		}
	}
}

func TestInspectDecodeEntryKeyParts(t *testing.T) {
	in := newInspected(t)
	entries, _ := in.decodeAll(t)
	var gotLease, gotAgg bool
	for _, e := range entries {
		switch {
		case e.Kind == schema.EntryOwnerLiveness && e.Owner == in.lease.Token():
			require.Equal(t, authority.NodeDescriptor{MeshName: "mesh-1", RID: "node c/é"}, e.Node)
			require.EqualValues(t, 3, e.Lifecycle)
			gotLease = true
		case e.Kind == schema.EntryAggregate && e.Fence.AggregateID == "move/1":
			require.EqualValues(t, 1, e.Fence.AggregateGeneration)
			gotAgg = true
		}
	}
	require.True(t, gotLease, "escaped owner and node decoded")
	require.True(t, gotAgg, "escaped aggregate ID decoded")
}

func TestInspectDecodeEntryUnknown(t *testing.T) {
	ns := "/inspect/"
	for _, key := range []string{"/other/rows/actor/a", ns + "doctor-probe/x", ns + "rowsx", ns} {
		e, err := schema.DecodeEntry(ns, &mvccpb.KeyValue{Key: []byte(key), Value: []byte("anything")})
		require.NoError(t, err, key)
		require.Equal(t, schema.EntryUnknown, e.Kind, key)
		require.False(t, e.Expired(time.Now()))
	}
	require.Equal(t, ns, schema.Prefix(ns, schema.EntryUnknown))
	require.Equal(t, ns+"capacity/", schema.Prefix(ns, schema.EntryCapacity))
	require.Equal(t, "capacity", schema.EntryCapacity.String())
	require.Equal(t, ns+"capacity-epochs/", schema.Prefix(ns, schema.EntryCapacityEpoch))
	require.Equal(t, "EntryKind(99)", schema.EntryKind(99).String())
}

// rowValue frames meta as a stored row (format byte, length, metadata, payload).
func rowValue(meta string) string {
	var n [binary.MaxVarintLen64]byte
	return "\x01" + string(n[:binary.PutUvarint(n[:], uint64(len(meta)))]) + meta + "payload"
}

func TestInspectDecodeEntryCorrupt(t *testing.T) {
	in := newInspected(t)
	ns := in.s.Namespace()
	// a valid value of every kind, to corrupt one part at a time
	entries, kvs := in.decodeAll(t)
	valid := map[schema.EntryKind]*mvccpb.KeyValue{}
	for i, e := range entries {
		if valid[e.Kind] == nil && (e.Kind != schema.EntryCapacity || !e.Capacity.Aggregate) {
			valid[e.Kind] = kvs[i]
		}
	}
	value := func(k schema.EntryKind) string { return string(valid[k].Value) }
	var compactTerminal string
	for _, kv := range kvs {
		if e, err := schema.DecodeEntry(ns, kv); err == nil && e.Kind == schema.EntryTerminal && kv.Value[0] == 0 {
			compactTerminal = string(kv.Value)
		}
	}
	require.NotEmpty(t, compactTerminal, "a compact creation terminal")
	op := "x/1/" + strings.Repeat("0", 31) + "1"
	cases := []struct{ name, key, value string }{
		{"row not framed", "rows/actor/a", "not a row"},
		{"row short frame", "rows/actor/a", "\x01\x7f{}"},
		{"row bad metadata", "rows/actor/a", rowValue(`{"st":`)},
		{"row bad state", "rows/actor/a", rowValue(`{"st":"gone"}`)},
		{"liveness value", "owners/o/1/m/r/1", "{"},
		{"liveness key parts", "owners/o/1/m/r", `{"m":"m","r":"r","g":1,"o":"o","l":1}`},
		{"liveness lease generation", "owners/o/x/m/r/1", `{"m":"m","r":"r","g":1,"o":"o","l":1}`},
		{"liveness value names another node", "owners/o/1/m/r/1", `{"m":"m","r":"other","g":1,"o":"o","l":1}`},
		{"owner generation value", "owner-gens/o", "one"},
		{"owner generation escape", "owner-gens/%zz", "1"},
		{"owner index parts", "owner-rows/o/1", ""},
		{"owner index generation", "owner-rows/o/x/actor/a", ""},
		{"capacity holder", "capacity/m/r/1/other/actor/a", value(schema.EntryCapacity)},
		{"capacity lifecycle", "capacity/m/r/x/row/actor/a", value(schema.EntryCapacity)},
		{"capacity parts", "capacity/m/r/1/row", value(schema.EntryCapacity)},
		{"capacity aggregate parts", "capacity/m/r/1/agg/a", value(schema.EntryCapacity)},
		{"capacity aggregate generation", "capacity/m/r/1/agg/a/x", value(schema.EntryCapacity)},
		{"capacity value", "capacity/m/r/1/row/actor/a", "[]"},
		{"capacity state", "capacity/m/r/1/row/actor/a", `{"st":"gone","a":1}`},
		{"placement owner", "capacity/m/r/1/o/%zz/1/actor/a", value(schema.EntryCapacity)},
		{"placement generation", "capacity/m/r/1/o/o/x/actor/a", value(schema.EntryCapacity)},
		{"placement parts", "capacity/m/r/1/o/o/1", value(schema.EntryCapacity)},
		{"owner directory parts", "owner-nodes/o/1/m/r", ""},
		{"owner directory lifecycle", "owner-nodes/o/1/m/r/x", ""},
		{"owner directory generation", "owner-nodes/o/x/m/r/1", ""},
		{"owner directory value", "owner-nodes/o/1/m/r/1", "x"},
		{"compact terminal under no operation", "terminals/x/1/00", compactTerminal},
		{"compact terminal under an uncanonical operation", "terminals/x/01/" + strings.Repeat("0", 31) + "1", compactTerminal},
		{"compact terminal value", "terminals/" + op, "\x00\x02\xff"},
		{"compact terminal unknown field", "terminals/" + op, compactTerminal + "\xf8\x01\x01"},
		{"capacity epoch parts", "capacity-epochs/m/r", ""},
		{"capacity epoch lifecycle", "capacity-epochs/m/r/x", ""},
		{"capacity epoch value", "capacity-epochs/m/r/1", "x"},
		{"reservation value", "reservations/r", "{"},
		{"reservation escape", "reservations/%zz", value(schema.EntryReservation)},
		{"terminal value", "terminals/x/1/00", "{"},
		{"terminal under another operation", "terminals/x/1/00", value(schema.EntryTerminal)},
		{"aggregate value", "aggregates/a/1", "not gob"},
		{"aggregate generation", "aggregates/a/x", value(schema.EntryAggregate)},
		{"aggregate parts", "aggregates/a", value(schema.EntryAggregate)},
		{"blob value", "blobs/b", "1234567"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := schema.DecodeEntry(ns, &mvccpb.KeyValue{Key: []byte(ns + c.key), Value: []byte(c.value), ModRevision: 5, CreateRevision: 5})
			require.Error(t, err)
			require.True(t, errors.Is(err, authority.ErrCorrupt), "%v", err)
			require.Contains(t, err.Error(), c.key)
		})
	}
	// the valid values decode: the cases fail for the part they corrupt
	for k, kv := range valid {
		_, err := schema.DecodeEntry(ns, kv)
		require.NoError(t, err, "%s", k)
	}
	_, err := schema.DecodeEntry(ns, &mvccpb.KeyValue{Key: []byte(ns + "blobs/b"), Value: bytes.Repeat([]byte{0}, 8)})
	require.NoError(t, err, "an empty blob is a blob")
}
