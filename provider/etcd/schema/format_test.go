package schema

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/mvccpb"

	authority "github.com/zlink-systems/authority"
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
		{"row", l.Row(row.Key), row.Encode(), next("\x02", row.Encode()[1:])},
		{"aggregate", l.Aggregate(fence), agg.Encode(), next("\x00\x02", agg.Encode()[len(aggregateFormat1):])},
		{"capacity", l.CapacityRow(row.Alloc, row.Key), goldenValues()["capacity-entry"], ""},
		{"reservation", l.Reservation("r-1"), goldenValues()["reservation"], ""},
		{"creation terminal", l.Terminal(goldenTerminal().Operation), goldenValues()["creation-terminal"], ""},
		{"liveness", l.Liveness(node, 3, owner), goldenValues()["liveness"], ""},
		{"owner generation", l.OwnerGen(owner.OwnerID), goldenValues()["owner-generation"], ""},
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
