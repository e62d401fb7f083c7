package schema

import (
	"encoding/binary"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/mvccpb"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/provider/etcd/schema/internal/compactpb"
	"github.com/zlink-systems/authority/provider/etcd/storeversion"
)

// TestLaterFormatIsRefused: a value of the next format of its kind (marked
// as format.go says a later format will be) is ErrCorrupt to DecodeEntry —
// what every reader of the provider and of authorityctl goes through — and
// never decodes as some value of the current format. The current value of
// each kind decodes, so the refusal is the marker's.
func TestLaterFormatIsRefused(t *testing.T) {
	const ns = "/ns/"
	l := Layout{ns: ns}
	node := authority.NodeDescriptor{MeshName: "mesh", RID: "node-1"}
	owner := authority.OwnerToken{OwnerID: "owner-a", LeaseGeneration: 99}
	fence := authority.Fence{AggregateID: "move-1", AggregateGeneration: 2}
	row := goldenRow(authority.AllocationActive)
	agg := goldenAggregate(AggregateCommitted)
	agg.Request.TargetDescriptorLifecycleGeneration = 3
	next := func(marker, current string) string { return marker + current }
	cases := []struct {
		name, key, current, later string
	}{
		{"row", l.Row(row.Key), row.Encode(), next("\x03", row.Encode()[1:])},
		{"row compact", l.Row(row.Key), row.EncodeAt(storeversion.CompactFormat), next("\x03", row.EncodeAt(storeversion.CompactFormat)[1:])},
		{"capacity compact", l.CapacityRow(row.Alloc, row.Key), goldenValues()["capacity-entry.v2-compact"],
			next("\x00\x03", goldenValues()["capacity-entry.v2-compact"][len(compactMarker):])},
		{"aggregate", l.Aggregate(fence), agg.Encode(), next("\x00\x02", agg.Encode()[len(aggregateFormat1):])},
		{"capacity", l.CapacityRow(row.Alloc, row.Key), goldenValues()["capacity-entry"], next("\x00\x03", goldenValues()["capacity-entry"])},
		{"reservation", l.Reservation("r-1"), goldenValues()["reservation"], ""},
		{"creation terminal", l.Terminal(goldenTerminal().Operation), goldenValues()["creation-terminal"], ""},
		{"creation terminal compact", l.Terminal(goldenTerminal().Operation), goldenValues()["creation-terminal.v5-fewer-keys"],
			next("\x00\x03", goldenValues()["creation-terminal.v5-fewer-keys"][len(compactMarker):])},
		{"row fewer keys", l.Row(row.Key), goldenValues()["row-active-committed.v5-fewer-keys"],
			next("\x03", goldenValues()["row-active-committed.v5-fewer-keys"][1:])},
		{"placement key", l.Placement(row.Alloc, owner, row.Key), goldenValues()["capacity-entry.v2-compact"],
			next("\x00\x03", goldenValues()["capacity-entry.v2-compact"][len(compactMarker):])},
		{"liveness", l.Liveness(node, 3, owner), goldenValues()["liveness"], ""},
		{"owner generation", l.OwnerGen(owner.OwnerID), goldenValues()["owner-generation"], ""},
		{"budget slice", l.BudgetSlice(node, 3), goldenValues()["budget-slice"], ""},
		{"budget ledger", l.BudgetLedger(node, 3), goldenValues()["budget-ledger"], ""},
		{"shard map", l.ShardMap(), goldenValues()["shard-map"], ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			later := tc.later
			if later == "" { // JSON objects and decimal text: 00 02 in front, as aggregate records did
				later = next("\x00\x02", tc.current)
			}
			kv := func(v string) *mvccpb.KeyValue {
				return &mvccpb.KeyValue{Key: []byte(tc.key), Value: []byte(v), ModRevision: 12, CreateRevision: 5}
			}
			e, err := DecodeEntry(ns, kv(tc.current))
			require.NoError(t, err, "the current format decodes")
			require.NotEqual(t, EntryUnknown, e.Kind)
			_, err = DecodeEntry(ns, kv(later))
			require.ErrorIs(t, err, authority.ErrCorrupt, "a later format is refused")
		})
	}
}

// TestCompactUnknownFieldIsRefused: a compact value carrying a field this
// build does not know (a later format's, at any depth) is ErrCorrupt, as an
// unknown JSON field of format 1 is; so is an enum value it does not know.
func TestCompactUnknownFieldIsRefused(t *testing.T) {
	row := goldenRow(authority.AllocationReserved)
	frame := func(meta []byte) []byte {
		v := []byte{rowFormatCompact}
		v = binary.AppendUvarint(v, uint64(len(meta)))
		return append(append(v, meta...), row.Payload...)
	}
	meta := func(m *compactpb.Row) []byte { return marshalCompact(m) }
	base := func() *compactpb.Row {
		v := []byte(row.EncodeAt(storeversion.CompactFormat))
		n, sz := binary.Uvarint(v[1:])
		var m compactpb.Row
		require.NoError(t, proto.Unmarshal(v[1+sz:1+sz+int(n)], &m))
		return &m
	}
	kv := func(v []byte) *mvccpb.KeyValue {
		return &mvccpb.KeyValue{Key: []byte("k"), Value: v, ModRevision: 12, CreateRevision: 5}
	}
	_, err := DecodeRow(row.Key, kv(frame(meta(base()))))
	require.NoError(t, err, "the unchanged compact row decodes")

	top := protowire.AppendVarint(protowire.AppendTag(meta(base()), 20, protowire.VarintType), 1)
	nested := base()
	nested.Pending.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 9, protowire.VarintType), 1))
	badState, badKind := base(), base()
	badState.State, badKind.Kind = compactpb.State(7), compactpb.Kind(0)
	for name, v := range map[string][]byte{
		"unknown field": frame(top), "unknown nested field": frame(meta(nested)),
		"unknown state": frame(meta(badState)), "no kind": frame(meta(badKind)),
	} {
		_, err := DecodeRow(row.Key, kv(v))
		require.ErrorIs(t, err, authority.ErrCorrupt, name)
	}
	entry := compactMarker + string(protowire.AppendVarint(protowire.AppendTag(
		marshalCompact(&compactpb.CapacityEntry{State: compactpb.State_ACTIVE, Actors: 1}), 9, protowire.VarintType), 1))
	_, _, err = DecodeCapacityEntry([]byte(entry))
	require.ErrorIs(t, err, errUnknownCompactField)
}
