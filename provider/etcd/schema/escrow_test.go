package schema

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/mvccpb"

	authority "github.com/zlink-systems/authority"
)

var (
	budgetActors = BudgetCounter{Kind: authority.ObjectActor}
	budgetSpots  = BudgetCounter{Kind: authority.CounterSpots}
	budgetRooms  = BudgetCounter{Kind: authority.ObjectUserSpot, StableType: "chat.Room"}
)

func goldenSlice() BudgetSlice {
	return BudgetSlice{Received: Budget{budgetActors: 40, budgetSpots: 9, budgetRooms: 3}, Returned: Budget{budgetActors: 12}}
}

func goldenLedger() BudgetLedger {
	return BudgetLedger{Shards: map[int]LedgerShard{
		0: {Given: Budget{budgetActors: 40, budgetSpots: 9, budgetRooms: 3}, Taken: Budget{budgetActors: 12}},
		2: {Given: Budget{budgetActors: 8}, Taken: Budget{}},
	}}
}

// TestBudgetRoundTrip: a slice and a ledger decode to what was encoded,
// through DecodeEntry too (with the node lifecycle from the key), and the
// ledger's Granted is the sum of its lines.
func TestBudgetRoundTrip(t *testing.T) {
	l := Layout{ns: "/ns/"}
	node := authority.NodeDescriptor{MeshName: "mesh a", RID: "node/1"}
	kv := func(key, v string) *mvccpb.KeyValue { return &mvccpb.KeyValue{Key: []byte(key), Value: []byte(v)} }

	s, err := DecodeBudgetSlice(kv(l.BudgetSlice(node, 3), goldenSlice().Encode()))
	require.NoError(t, err)
	require.Equal(t, goldenSlice(), s)
	require.Equal(t, Budget{budgetActors: 28, budgetSpots: 9, budgetRooms: 3}, s.Size())

	led, err := DecodeBudgetLedger(kv(l.BudgetLedger(node, 3), goldenLedger().Encode()))
	require.NoError(t, err)
	require.Equal(t, goldenLedger(), led)
	require.Equal(t, Budget{budgetActors: 36, budgetSpots: 9, budgetRooms: 3}, led.Granted())

	e, err := DecodeEntry("/ns/", kv(l.BudgetSlice(node, 3), goldenSlice().Encode()))
	require.NoError(t, err)
	require.Equal(t, EntryEscrow, e.Kind)
	require.Equal(t, node, e.Node)
	require.Equal(t, int64(3), e.Lifecycle)
	require.Equal(t, goldenSlice(), *e.BudgetSlice)
	e, err = DecodeEntry("/ns/", kv(l.BudgetLedger(node, 3), goldenLedger().Encode()))
	require.NoError(t, err)
	require.Equal(t, goldenLedger(), *e.BudgetLedger)
	require.Equal(t, "/ns/capacity-escrow/", Prefix("/ns/", EntryEscrow))
}

// TestBudgetDecodeIsStrict: every malformed slice or ledger is ErrCorrupt
// naming its key.
func TestBudgetDecodeIsStrict(t *testing.T) {
	l := Layout{ns: "/ns/"}
	node := authority.NodeDescriptor{MeshName: "m", RID: "r"}
	for name, v := range map[string]string{
		"not json":          "nope",
		"null":              "null",
		"missing returned":  `{"r":[]}`,
		"null received":     `{"r":null,"x":[]}`,
		"unknown field":     `{"r":[],"x":[],"z":1}`,
		"negative":          `{"r":[{"k":"actor","c":-1}],"x":[]}`,
		"zero":              `{"r":[{"k":"actor","c":0}],"x":[]}`,
		"too large":         `{"r":[{"k":"actor","c":2305843009213693953}],"x":[]}`,
		"unknown kind":      `{"r":[{"k":"robot","c":1}],"x":[]}`,
		"actor with a type": `{"r":[{"k":"actor","t":"x","c":1}],"x":[]}`,
		"twice":             `{"r":[{"k":"actor","c":1},{"k":"actor","c":2}],"x":[]}`,
		"trailing":          `{"r":[],"x":[]} {}`,
	} {
		_, err := DecodeBudgetSlice(&mvccpb.KeyValue{Key: []byte(l.BudgetSlice(node, 1)), Value: []byte(v)})
		requireCorrupt(t, "slice "+name, err)
	}
	for name, v := range map[string]string{
		"no shards":      `{}`,
		"shard twice":    `{"s":[{"i":1,"g":[],"t":[]},{"i":1,"g":[],"t":[]}]}`,
		"negative shard": `{"s":[{"i":-1,"g":[],"t":[]}]}`,
		"missing taken":  `{"s":[{"i":1,"g":[]}]}`,
		"bad count":      `{"s":[{"i":1,"g":[{"k":"spot","c":-4}],"t":[]}]}`,
	} {
		_, err := DecodeBudgetLedger(&mvccpb.KeyValue{Key: []byte(l.BudgetLedger(node, 1)), Value: []byte(v)})
		requireCorrupt(t, "ledger "+name, err)
	}
	for _, key := range []string{"/ns/capacity-escrow/slices/m/r", "/ns/capacity-escrow/other/m/r/1", "/ns/capacity-escrow/ledgers/m/r/x"} {
		_, err := DecodeEntry("/ns/", &mvccpb.KeyValue{Key: []byte(key), Value: []byte(goldenSlice().Encode())})
		require.ErrorIs(t, err, authority.ErrCorrupt, key)
	}
}

// TestBudgetArithmetic: Plus, Minus, Max, Covers and Positive count per
// counter, and an absent counter is 0.
func TestBudgetArithmetic(t *testing.T) {
	a := Budget{budgetActors: 5, budgetSpots: 2}
	b := Budget{budgetActors: 3, budgetRooms: 4}
	require.Equal(t, Budget{budgetActors: 8, budgetSpots: 2, budgetRooms: 4}, a.Plus(b))
	require.Equal(t, Budget{budgetActors: 2, budgetSpots: 2, budgetRooms: -4}, a.Minus(b))
	require.Equal(t, Budget{budgetActors: 5, budgetSpots: 2, budgetRooms: 4}, a.Max(b))
	require.Equal(t, Budget{budgetActors: 2, budgetSpots: 2}, a.Minus(b).Positive())
	require.True(t, a.Covers(Budget{budgetActors: 5}))
	require.False(t, a.Covers(b))
	require.True(t, a.Minus(a).IsZero())
	require.Empty(t, a.Minus(a), "counters at 0 are dropped")
	require.Equal(t, Budget{budgetSpots: 1, budgetRooms: 1}, BudgetOf(authority.CapacityVector{Spots: 1,
		SpotType: &authority.SpotTypeCapacity{ObjectKind: authority.ObjectUserSpot, StableType: "chat.Room", Count: 1}}))
	require.NoError(t, a.CheckStored())
	require.Error(t, Budget{budgetActors: -1}.CheckStored())
	require.Error(t, Budget{budgetActors: maxBudgetCount + 1}.CheckStored())
}

// FuzzDecodeBudget: decoding any bytes as a slice or a ledger never panics,
// refuses with ErrCorrupt, and what it accepts re-encodes to a value that
// decodes to the same thing.
func FuzzDecodeBudget(f *testing.F) {
	f.Add([]byte(goldenSlice().Encode()))
	f.Add([]byte(goldenLedger().Encode()))
	f.Add([]byte(`{"r":[],"x":[]}`))
	f.Add([]byte(`{"s":[]}`))
	f.Fuzz(func(t *testing.T, v []byte) {
		kv := &mvccpb.KeyValue{Key: []byte("/ns/capacity-escrow/slices/m/r/1"), Value: v}
		if s, err := DecodeBudgetSlice(kv); err != nil {
			requireCorrupt(t, "slice", err)
		} else {
			again, err := DecodeBudgetSlice(&mvccpb.KeyValue{Key: kv.Key, Value: []byte(s.Encode())})
			require.NoError(t, err)
			require.Equal(t, s, again)
		}
		if l, err := DecodeBudgetLedger(kv); err != nil {
			requireCorrupt(t, "ledger", err)
		} else {
			again, err := DecodeBudgetLedger(&mvccpb.KeyValue{Key: kv.Key, Value: []byte(l.Encode())})
			require.NoError(t, err)
			require.Equal(t, l, again)
		}
	})
}
