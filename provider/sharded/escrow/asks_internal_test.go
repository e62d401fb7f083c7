package escrow

import (
	"testing"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
)

func actors(n int64) authority.CapacityVector { return authority.CapacityVector{Actors: n} }

// TestAsks: a grow asks, largest first, for all a vector counts, Chunk
// times the waiting requests and halvings down to them, then halvings of
// them down to the first request: each what the slice lacks next to the
// usage, none when the slice holds the first request.
func TestAsks(t *testing.T) {
	m, err := New(Config{Shards: 1})
	require.NoError(t, err)
	a := schema.BudgetCounter{Kind: authority.ObjectActor}
	empty := etcdstore.SliceState{Slice: schema.BudgetSlice{Received: schema.Budget{}, Returned: schema.Budget{}}, Usage: schema.Budget{}}
	var got []int64
	for _, ask := range m.asks(empty, etcdstore.BudgetRequest{Need: actors(1), Want: actors(42)}, true) {
		got = append(got, ask.Actors)
	}
	require.Equal(t, []int64{maxCount, 336, 168, 84, 42, 21, 11, 6, 3, 2, 1}, got)

	got = got[:0]
	for _, ask := range m.asks(empty, etcdstore.BudgetRequest{Need: actors(1), Want: actors(4)}, false) {
		got = append(got, ask.Actors)
	}
	require.Equal(t, []int64{4, 2, 1}, got, "after a reclaim: no chunk")

	// 7 in the slice, 5 used: the first request of 3 lacks 1
	st := etcdstore.SliceState{Slice: schema.BudgetSlice{Received: schema.Budget{a: 10}, Returned: schema.Budget{a: 3}}, Usage: schema.Budget{a: 5}}
	asks := m.asks(st, etcdstore.BudgetRequest{Need: actors(3), Want: actors(3)}, false)
	require.Equal(t, []authority.CapacityVector{actors(1)}, asks)
	require.Empty(t, m.asks(st, etcdstore.BudgetRequest{Need: actors(2), Want: actors(2)}, true), "the slice holds it")

	spot := func(n int64) authority.CapacityVector {
		return authority.CapacityVector{Spots: n, SpotType: &authority.SpotTypeCapacity{ObjectKind: authority.ObjectUserSpot, StableType: "room", Count: n}}
	}
	// the Spot type has room in the slice, the Spot total not: only Spots are asked for
	st = etcdstore.SliceState{Slice: schema.BudgetSlice{Received: schema.Budget{{Kind: authority.ObjectUserSpot, StableType: "room"}: 5}, Returned: schema.Budget{}}, Usage: schema.Budget{}}
	asks = m.asks(st, etcdstore.BudgetRequest{Need: spot(1), Want: spot(1)}, false)
	require.Equal(t, []authority.CapacityVector{{Spots: 1}}, asks)
}

// TestVectorArithmetic: scale and plus stop at the contract's bound, halve
// never goes below its floor, covers needs the same counters.
func TestVectorArithmetic(t *testing.T) {
	require.Equal(t, actors(maxCount), scale(actors(1<<20), 1<<20))
	require.Equal(t, actors(maxCount), plus(actors(maxCount), actors(5)))
	require.Equal(t, actors(3), halve(actors(5), actors(1)))
	require.Equal(t, actors(4), halve(actors(5), actors(4)))
	require.True(t, covers(actors(5), actors(5)))
	require.False(t, covers(actors(4), actors(5)))
	require.False(t, covers(authority.CapacityVector{Actors: 5, Spots: 1}, actors(5)), "another shape")
}
