package schema

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/mvccpb"

	authority "github.com/zlink-systems/authority"
)

// DecodeNodeCapacityEntry reads the entries the layout puts under a node
// lifecycle (a row's and an aggregate's) and refuses as ErrCorrupt any other
// key of the range or outside it, and a value that does not decode strictly.
func TestDecodeNodeCapacityEntry(t *testing.T) {
	l := Layout{ns: "/ns/"}
	alloc := goldenAllocation(authority.AllocationActive)
	prefix := l.CapacityNode(alloc.Descriptor, alloc.DescriptorLifecycleGeneration)
	value := EncodeCapacityEntry(authority.AllocationReserved, alloc.Capacity)
	kv := func(key, value string) *mvccpb.KeyValue {
		return &mvccpb.KeyValue{Key: []byte(key), Value: []byte(value)}
	}
	for _, key := range []string{l.CapacityRow(alloc, "user_spot/room-1"),
		l.CapacityAggregate(alloc, authority.Fence{AggregateID: "move-1", AggregateGeneration: 2})} {
		st, c, err := DecodeNodeCapacityEntry(prefix, kv(key, value))
		require.NoError(t, err, key)
		require.Equal(t, authority.AllocationReserved, st)
		require.Equal(t, alloc.Capacity, c)
	}
	other := alloc
	other.DescriptorLifecycleGeneration++
	for _, bad := range []*mvccpb.KeyValue{
		kv(prefix+"rows/user_spot/room-1", value),                // no sub-segment of the layout
		kv(prefix+capRow, value),                                 // the sub-segment alone
		kv(l.CapacityRow(other, "user_spot/room-1"), value),      // another node lifecycle
		kv(l.CapacityRow(alloc, "user_spot/room-1"), `{"st":1}`), // a value that does not decode
		kv(l.CapacityRow(alloc, "user_spot/room-1"), ""),
	} {
		_, _, err := DecodeNodeCapacityEntry(prefix, bad)
		require.ErrorIs(t, err, authority.ErrCorrupt, "%s = %q", bad.Key, bad.Value)
	}
}
