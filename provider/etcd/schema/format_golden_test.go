package schema

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/mvccpb"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/provider/etcd/storeversion"
)

var updateFormat = flag.Bool("update-format", false, "rewrite the stored-format golden files under testdata/format/")

// goldenTime is the fixed time of every golden value.
var goldenTime = time.Date(2030, 1, 2, 3, 4, 5, 600, time.UTC)

func goldenAllocation(state authority.AllocationState) authority.PlacementAllocation {
	return authority.PlacementAllocation{
		State: state, ObjectKind: authority.ObjectUserSpot, StableType: "chat.Room",
		Descriptor:                    authority.NodeDescriptor{MeshName: "mesh", RID: "node-1"},
		DescriptorLifecycleGeneration: 3,
		Capacity: authority.CapacityVector{Spots: 1, SpotType: &authority.SpotTypeCapacity{
			ObjectKind: authority.ObjectUserSpot, StableType: "chat.Room", Count: 1}},
	}
}

func goldenRow(state authority.AllocationState) *Row {
	r := &Row{Key: "user_spot/room-1", OwnerGen: 7, Token: 9, Owner: authority.OwnerToken{OwnerID: "owner-a", LeaseGeneration: 2},
		Alloc: goldenAllocation(state), Payload: []byte("payload \x00\xff")}
	if state == authority.AllocationReserved { // as a reserve writes it: this write's revision
		r.OwnerGen, r.Token = 0, 0
		r.Pending = &authority.PendingCreation{ReservationID: "0123456789abcdef0123456789abcdef",
			RequestContentReference: "content-1", RequestSHA256: bytes.Repeat([]byte{0xab}, 32), RequestEncodedSize: 9}
	}
	return r
}

// goldenMovedRow is goldenRow's active row as a resharding copies it: its
// object generation kept as a number.
func goldenMovedRow() *Row {
	r := goldenRow(authority.AllocationActive)
	r.CreateRev, r.ModRev = 5, 11
	return r.Moved()
}

func goldenTerminal() *authority.TerminalRecord {
	return &authority.TerminalRecord{State: authority.TerminalCreated,
		Operation:     authority.CreationOperation{SourceNodeRID: "node-1", SourceNodeGeneration: 3, OperationID: authority.CreationOperationID{High: 1, Low: 2}},
		ReservationID: "0123456789abcdef0123456789abcdef", ObjectKind: authority.ObjectActor,
		TerminalEnvelope: []byte("envelope"), TerminalEnvelopeSHA256: bytes.Repeat([]byte{0xcd}, 32),
		ExpiresAt: goldenTime.Add(time.Hour), StoreNow: goldenTime}
}

func goldenAggregate(state string) *AggregateRecord {
	rec := &AggregateRecord{State: state, Request: authority.AggregatePrepareRequest{
		AggregateID: "move-1", AggregateGeneration: 2,
		TargetOwner:      authority.OwnerToken{OwnerID: "owner-b", LeaseGeneration: 1},
		TargetDescriptor: authority.NodeDescriptor{MeshName: "mesh", RID: "node-2"}, TargetDescriptorLifecycleGeneration: 4,
		Capacity:        authority.CapacityVector{Actors: 1},
		InventoryDigest: bytes.Repeat([]byte{0xef}, 32),
		Participants: []authority.AggregateParticipant{
			{AuthorityKey: "actor/a1", ExpectedStoreVersion: "41", OwnerTransition: authority.TransitionNewOwner,
				AuthorityPayload: []byte("a1 moved"), MembershipMutation: []byte("join g")},
			{AuthorityKey: "actor/b1", ExpectedStoreVersion: "42", OwnerTransition: authority.TransitionPreserve,
				AuthorityPayload: []byte("b1 kept")},
		},
	}}
	if state != AggregatePrepared {
		rec.ExpiresAt = goldenTime.Add(10 * time.Minute)
	}
	return rec
}

// goldenCrossShard is goldenAggregate(state) as a cross-shard record.
func goldenCrossShard(state string) *AggregateRecord {
	rec := goldenAggregate(state)
	rec.Incarnation = "0123456789abcdef"
	return rec
}

func goldenRowLock() RowLock {
	return RowLock{Fence: authority.Fence{AggregateID: "move-1", AggregateGeneration: 2}, Incarnation: "0123456789abcdef", Attempt: "fedcba9876543210", Base: 17}
}

func goldenShardMap() ShardMap {
	return ShardMap{Epoch: 1, Hash: "fnv1a64-jump", Shards: []ShardMapShard{
		{ClusterID: "cdf818194e3a8c32", Namespace: "/zlink/authority/v1/"},
		{ClusterID: "8e9e05c52164694d", Namespace: "/zlink/authority/v1/"},
	}}
}

// goldenValues are every kind of value the store writes, from fixed inputs.
func goldenValues() map[string]string {
	return map[string]string{
		"row-reserved":        goldenRow(authority.AllocationReserved).Encode(),
		"row-active":          goldenRow(authority.AllocationActive).Encode(),
		"capacity-entry":      EncodeCapacityEntry(authority.AllocationActive, goldenAllocation(authority.AllocationActive).Capacity),
		"reservation":         ReservationTerminal{State: ReservationCommitted, ExpiresAt: goldenTime}.Encode(),
		"creation-terminal":   EncodeTerminal(goldenTerminal()),
		"liveness":            Liveness{MeshName: "mesh", RID: "node-1", Lifecycle: 3, OwnerID: "owner-a", Lease: 99}.Encode(),
		"aggregate-prepared":  goldenAggregate(AggregatePrepared).Encode(),
		"aggregate-committed": goldenAggregate(AggregateCommitted).Encode(),
		"owner-generation":    EncodeOwnerGeneration(41),
		"blob":                EncodeBlob(goldenTime, []byte("relocation \x00 data")),
		"budget-slice":        goldenSlice().Encode(),
		"budget-ledger":       goldenLedger().Encode(),
		"shard-map":           goldenShardMap().Encode(),
		// the compact format (storeversion.CompactFormat)
		"row-reserved.v2-compact":   goldenRow(authority.AllocationReserved).EncodeAt(storeversion.CompactFormat),
		"row-active.v2-compact":     goldenRow(authority.AllocationActive).EncodeAt(storeversion.CompactFormat),
		"capacity-entry.v2-compact": EncodeCapacityEntryAt(storeversion.CompactFormat, authority.AllocationActive, goldenAllocation(authority.AllocationActive).Capacity),
		// cross-shard aggregates (storeversion.RowLocks)
		"aggregate-prepared.v4-cross-shard": goldenCrossShard(AggregatePrepared).Encode(),
		"row-lock":                          goldenRowLock().Encode(),
		"aggregate-part":                    AggregatePart{Incarnation: "0123456789abcdef", Tokens: map[authority.Key]int64{"actor/a1": 0}}.Encode(),
		// storeversion.FewerKeys: a row with its placement flag and the
		// reservation that committed it, and the compact creation terminal
		"row-active-committed.v5-fewer-keys": goldenCommittedRow().EncodeAt(storeversion.FewerKeys),
		"creation-terminal.v5-fewer-keys":    EncodeTerminalAt(storeversion.FewerKeys, goldenCompactTerminal()),
		// a row a resharding copied (storeversion.RowMoves)
		"row-active.v6-moved":         goldenMovedRow().Encode(),
		"row-active.v6-moved-compact": goldenMovedRow().EncodeAt(storeversion.RowMoves),
	}
}

// TestStoredFormatGolden pins the bytes of every stored value kind: a
// change to the stored format fails here until the golden files are
// rewritten (go test -run TestStoredFormatGolden -update-format), which a
// reviewer then sees. Each golden value also decodes back to its input.
func TestStoredFormatGolden(t *testing.T) {
	for name, value := range goldenValues() {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join("testdata", "format", name+".golden")
			if *updateFormat {
				require.NoError(t, os.WriteFile(path, []byte(value), 0o644))
			}
			want, err := os.ReadFile(path)
			require.NoError(t, err, "no golden file: run with -update-format")
			require.Equal(t, string(want), value, "the stored format of %s changed", name)
		})
	}
	kv := func(value string) *mvccpb.KeyValue {
		return &mvccpb.KeyValue{Key: []byte("k"), Value: []byte(value), ModRevision: 12, CreateRevision: 5}
	}
	v := goldenValues()
	active, err := DecodeRow("user_spot/room-1", kv(v["row-active"]))
	require.NoError(t, err)
	require.Equal(t, goldenRow(authority.AllocationActive).Payload, active.Payload)
	require.Equal(t, goldenRow(authority.AllocationActive).Alloc, active.Alloc)
	term, err := DecodeTerminal(kv(v["creation-terminal"]))
	require.NoError(t, err)
	require.Equal(t, goldenTerminal(), term)
	committed, err := DecodeRow("user_spot/room-1", kv(v["row-active-committed.v5-fewer-keys"]))
	require.NoError(t, err)
	require.True(t, committed.PlacementKey)
	require.Equal(t, goldenCommittedRow().Committed.ID, committed.Committed.ID)
	require.True(t, goldenCommittedRow().Committed.Until.Equal(committed.Committed.Until))
	compact, err := DecodeTerminal(&mvccpb.KeyValue{Key: []byte(NewLayout("/ns/").Terminal(goldenTerminal().Operation)),
		Value: []byte(v["creation-terminal.v5-fewer-keys"])})
	require.NoError(t, err)
	require.Equal(t, goldenCompactTerminal(), compact)
	agg, err := DecodeAggregate(kv(v["aggregate-committed"]))
	require.NoError(t, err)
	require.Equal(t, goldenAggregate(AggregateCommitted), agg)
	cross, err := DecodeAggregate(kv(v["aggregate-prepared.v4-cross-shard"]))
	require.NoError(t, err)
	require.Equal(t, goldenCrossShard(AggregatePrepared), cross)
	lock, err := DecodeRowLock(kv(v["row-lock"]))
	require.NoError(t, err)
	require.Equal(t, goldenRowLock(), lock)
	part, err := DecodeAggregatePart(kv(v["aggregate-part"]))
	require.NoError(t, err)
	require.Equal(t, map[authority.Key]int64{"actor/a1": 12}, part.Tokens, "token 0 reads as the marker's ModRevision")
	expires, data, err := DecodeBlob(kv(v["blob"]))
	require.NoError(t, err)
	require.True(t, expires.Equal(goldenTime))
	require.Equal(t, []byte("relocation \x00 data"), data)
}

// TestAggregateRecordFormat0StillDecodes: records written by the first
// format (gob of a struct holding the contract's request; golden files made
// by that code) decode to the same record as format 1, and format 1 starts
// with its version bytes.
func TestAggregateRecordFormat0StillDecodes(t *testing.T) {
	for _, state := range []string{AggregatePrepared, AggregateCommitted} {
		old, err := os.ReadFile(filepath.Join("testdata", "format", "aggregate-"+state+".v0-gob.golden"))
		require.NoError(t, err)
		rec, err := DecodeAggregate(&mvccpb.KeyValue{Key: []byte("k"), Value: old})
		require.NoError(t, err, state)
		require.Equal(t, goldenAggregate(state), rec, state)
		current := goldenAggregate(state).Encode()
		require.True(t, len(current) > 2 && current[:2] == aggregateFormat1)
		require.NotEqual(t, string(old), current, "format 1 is not gob")
	}
	_, err := DecodeAggregate(&mvccpb.KeyValue{Key: []byte("k"), Value: []byte(aggregateFormat1 + `{"st":"prepared"}`)})
	require.ErrorIs(t, err, authority.ErrCorrupt)
	_, err = DecodeAggregate(&mvccpb.KeyValue{Key: []byte("k"), Value: []byte("not gob")})
	require.ErrorIs(t, err, authority.ErrCorrupt)
}

// TestRowWithoutTokenStillDecodes: rows written before ownership tokens
// existed (no "tk" field; golden files made by that code) decode, and read
// the owner generation as their token — the revision of the last reserve or
// aggregate move, which that code recorded — so the first write of this
// code keeps that token, explicitly.
func TestRowWithoutTokenStillDecodes(t *testing.T) {
	for _, tc := range []struct {
		state     authority.AllocationState
		wantToken int64
	}{
		{authority.AllocationActive, 7},    // an explicit owner generation
		{authority.AllocationReserved, 12}, // the sentinel: this value's ModRevision
	} {
		old, err := os.ReadFile(filepath.Join("testdata", "format", "row-"+string(tc.state)+".v0-no-token.golden"))
		require.NoError(t, err)
		require.NotContains(t, string(old), `"tk"`)
		kv := &mvccpb.KeyValue{Key: []byte("k"), Value: old, ModRevision: 12, CreateRevision: 5}
		r, err := DecodeRow("user_spot/room-1", kv)
		require.NoError(t, err, tc.state)
		require.Equal(t, tc.wantToken, r.Token, tc.state)
		require.Equal(t, tc.wantToken, r.Snapshot(goldenTime).OwnershipToken, tc.state)
		require.Equal(t, r.OwnerGen, r.Token, tc.state)
		again, err := DecodeRow("user_spot/room-1", &mvccpb.KeyValue{Key: []byte("k"), Value: []byte(r.Next(0).Encode()), ModRevision: 20, CreateRevision: 5})
		require.NoError(t, err)
		require.Equal(t, tc.wantToken, again.Token, "a same-owner write keeps the token")
	}
}

// TestCompactFormatDecodesAsFormat1: every compact golden value decodes to
// exactly what its format-1 twin decodes to (so either format means the
// same row or entry), is smaller, and starts with its own marker; a
// namespace below CompactFormat still writes format 1.
func TestCompactFormatDecodesAsFormat1(t *testing.T) {
	v := goldenValues()
	kv := func(value string, mod int64) *mvccpb.KeyValue {
		return &mvccpb.KeyValue{Key: []byte("k"), Value: []byte(value), ModRevision: mod, CreateRevision: 5}
	}
	for _, name := range []string{"row-reserved", "row-active"} {
		old, err := DecodeRow("user_spot/room-1", kv(v[name], 12))
		require.NoError(t, err, name)
		compact, err := DecodeRow("user_spot/room-1", kv(v[name+".v2-compact"], 12))
		require.NoError(t, err, name)
		require.Equal(t, old, compact, name)
		require.Equal(t, rowFormatCompact, v[name+".v2-compact"][0])
		require.Less(t, len(v[name+".v2-compact"]), len(v[name]), name)
	}
	st, c, err := DecodeCapacityEntry([]byte(v["capacity-entry"]))
	require.NoError(t, err)
	st2, c2, err := DecodeCapacityEntry([]byte(v["capacity-entry.v2-compact"]))
	require.NoError(t, err)
	require.Equal(t, st, st2)
	require.Equal(t, c, c2)
	require.True(t, strings.HasPrefix(v["capacity-entry.v2-compact"], compactMarker))
	require.Less(t, len(v["capacity-entry.v2-compact"]), len(v["capacity-entry"]))
	for ver := storeversion.MinSupported; ver < storeversion.CompactFormat; ver++ {
		require.Equal(t, v["row-active"], goldenRow(authority.AllocationActive).EncodeAt(ver), "version %s writes format 1", ver)
		require.Equal(t, v["capacity-entry"], EncodeCapacityEntryAt(ver, authority.AllocationActive, c), "version %s", ver)
	}
	for ver := storeversion.CompactFormat; ver <= storeversion.Latest; ver++ {
		require.Equal(t, rowFormatCompact, goldenRow(authority.AllocationActive).EncodeAt(ver)[0], "version %s writes format 2", ver)
	}
}
