package schema

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"unicode/utf8"

	authority "github.com/zlink-systems/authority"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// Capacity escrow (provider/etcd Config.CapacityEscrow; docs/design-etcd.md
// "Capacity escrow across shards"): in a namespace spread over several etcd
// clusters (shards), each shard holds a budget slice of every node lifecycle
// it places rows on, and the node lifecycle's home shard holds its ledger,
// which records what it gave each shard and took back. Only a store in
// escrow mode writes these keys.

// SegEscrow is the layout segment of the capacity escrow's keys.
const SegEscrow = "capacity-escrow"

// the two kinds of key under SegEscrow
const (
	escrowSlices  = "slices"
	escrowLedgers = "ledgers"
)

// BudgetSlice is the key of a node lifecycle's budget slice in this shard.
func (l Layout) BudgetSlice(node authority.NodeDescriptor, lifecycle int64) string {
	return l.ns + SegEscrow + "/" + escrowSlices + "/" + esc(node.MeshName) + "/" + esc(node.RID) + "/" + itoa(lifecycle)
}

// BudgetLedger is the key of a node lifecycle's escrow ledger (in its home
// shard).
func (l Layout) BudgetLedger(node authority.NodeDescriptor, lifecycle int64) string {
	return l.ns + SegEscrow + "/" + escrowLedgers + "/" + esc(node.MeshName) + "/" + esc(node.RID) + "/" + itoa(lifecycle)
}

// BudgetLedgersPrefix is the prefix of every ledger key.
func (l Layout) BudgetLedgersPrefix() string { return l.ns + SegEscrow + "/" + escrowLedgers + "/" }

// maxBudgetCount bounds every count of a stored budget. Budgets count
// cumulatively (what a shard ever received or returned), so their bound is
// far above a capacity count's; twice it still fits an int64.
const maxBudgetCount = 1 << 61

// BudgetCounter names one capacity counter of a node lifecycle in a budget:
// the actor counter {ObjectActor, ""}, the total Spot counter
// {CounterSpots, ""}, or a Spot kind and its stable type.
type BudgetCounter struct {
	Kind       authority.ObjectKind
	StableType string
}

// BudgetCounterOf is the budget counter of a node lifecycle's counter c.
func BudgetCounterOf(c authority.CapacityCounter) BudgetCounter {
	return BudgetCounter{Kind: c.ObjectKind, StableType: c.StableType}
}

// On is the counter b of a node lifecycle.
func (b BudgetCounter) On(node authority.NodeDescriptor, lifecycle int64) authority.CapacityCounter {
	return authority.CapacityCounter{Node: node, LifecycleGeneration: lifecycle, ObjectKind: b.Kind, StableType: b.StableType}
}

func (b BudgetCounter) check() error {
	switch {
	case b.Kind == authority.ObjectActor || b.Kind == authority.CounterSpots:
		if b.StableType != "" {
			return fmt.Errorf("budget counter %q with a stable type", b.Kind)
		}
	case b.Kind.IsSpot():
		if !utf8.ValidString(b.StableType) || strings.IndexByte(b.StableType, 0) >= 0 {
			return fmt.Errorf("budget counter %q has an invalid stable type", b.Kind)
		}
	default:
		return fmt.Errorf("budget counter kind %q", b.Kind)
	}
	return nil
}

// Budget is a count per capacity counter of one node lifecycle (an absent
// counter counts 0).
type Budget map[BudgetCounter]int64

// BudgetOf is the budget a capacity vector takes: its non-zero counts.
func BudgetOf(c authority.CapacityVector) Budget {
	b := Budget{}
	for _, e := range authority.CapacityEntries(authority.NodeDescriptor{}, 0, c) {
		b[BudgetCounterOf(e.Counter)] += e.Count
	}
	return b
}

// Plus returns b + o, counter by counter.
func (b Budget) Plus(o Budget) Budget {
	sum := maps.Clone(b)
	if sum == nil {
		sum = Budget{}
	}
	for c, n := range o {
		sum[c] += n
	}
	return sum.compact()
}

// Minus returns b - o, counter by counter (a count may go below 0).
func (b Budget) Minus(o Budget) Budget {
	d := maps.Clone(b)
	if d == nil {
		d = Budget{}
	}
	for c, n := range o {
		d[c] -= n
	}
	return d.compact()
}

// Max returns the larger count of b and o, counter by counter.
func (b Budget) Max(o Budget) Budget {
	m := maps.Clone(b)
	if m == nil {
		m = Budget{}
	}
	for c, n := range o {
		m[c] = max(m[c], n)
	}
	return m.compact()
}

// Positive returns the counters of b above 0.
func (b Budget) Positive() Budget {
	p := Budget{}
	for c, n := range b {
		if n > 0 {
			p[c] = n
		}
	}
	return p
}

// Covers reports whether b holds at least o in every counter.
func (b Budget) Covers(o Budget) bool {
	for c, n := range o {
		if b[c] < n {
			return false
		}
	}
	return true
}

// IsZero reports whether every count of b is 0.
func (b Budget) IsZero() bool {
	for _, n := range b {
		if n != 0 {
			return false
		}
	}
	return true
}

// compact drops the counters at 0.
func (b Budget) compact() Budget {
	maps.DeleteFunc(b, func(_ BudgetCounter, n int64) bool { return n == 0 })
	return b
}

// CheckStored reports whether every count of b is one a stored budget may
// hold (0 ≤ n ≤ 2^61): a write that would pass it is refused before it is
// sent.
func (b Budget) CheckStored() error {
	for c, n := range b {
		if n < 0 || n > maxBudgetCount {
			return fmt.Errorf("budget count %d of %s/%q is out of range", n, c.Kind, c.StableType)
		}
	}
	return nil
}

// BudgetSlice is one shard's slice of a node lifecycle's capacity budget.
// Both counts are cumulative and never decrease: Received is a copy of what
// the ledger says it gave the shard (set to the ledger's figure, never
// added to, so applying a grant twice is applying it once), Returned is
// what the shard ever gave back. The slice is Received - Returned.
type BudgetSlice struct {
	Received, Returned Budget
}

// Size is the slice's budget: Received - Returned.
func (s BudgetSlice) Size() Budget { return s.Received.Minus(s.Returned) }

// BudgetLedger is a node lifecycle's escrow ledger, by shard index: what it
// gave each shard and what it took back from it, both cumulative and never
// decreasing (Taken is set to a figure the shard's slice returned).
type BudgetLedger struct {
	Shards map[int]LedgerShard
}

// LedgerShard is one shard's line of a ledger.
type LedgerShard struct {
	Given, Taken Budget
}

// Granted is the budget the ledger has handed out and not taken back: the
// sum over shards of Given - Taken. No shard's slice holds more than its
// line (its Received trails Given, its Returned leads Taken), so the
// shards' slices together hold at most Granted.
func (l BudgetLedger) Granted() Budget {
	g := Budget{}
	for _, sh := range l.Shards {
		g = g.Plus(sh.Given).Minus(sh.Taken)
	}
	return g
}

// maxLedgerShards bounds the shard index of a ledger line.
const maxLedgerShards = 1 << 16

// budgetEntryWire is one counter of a stored budget.
type budgetEntryWire struct {
	Kind  string `json:"k"`
	Type  string `json:"t,omitempty"`
	Count int64  `json:"c"`
}

// sliceWire is the stored value of a budget slice.
type sliceWire struct {
	Received *[]budgetEntryWire `json:"r"`
	Returned *[]budgetEntryWire `json:"x"`
}

// ledgerShardWire is one shard's line of a stored ledger.
type ledgerShardWire struct {
	Shard int                `json:"i"`
	Given *[]budgetEntryWire `json:"g"`
	Taken *[]budgetEntryWire `json:"t"`
}

// ledgerWire is the stored value of a ledger.
type ledgerWire struct {
	Shards *[]ledgerShardWire `json:"s"`
}

func encodeBudget(b Budget) *[]budgetEntryWire {
	w := make([]budgetEntryWire, 0, len(b))
	for c, n := range b {
		if n != 0 {
			w = append(w, budgetEntryWire{Kind: string(c.Kind), Type: c.StableType, Count: n})
		}
	}
	slices.SortFunc(w, func(a, b budgetEntryWire) int {
		return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Type, b.Type))
	})
	return &w
}

var errMissingBudget = errors.New("budget field missing or null")

func decodeBudget(w *[]budgetEntryWire) (Budget, error) {
	if w == nil {
		return nil, errMissingBudget
	}
	b := Budget{}
	for _, e := range *w {
		c := BudgetCounter{Kind: authority.ObjectKind(e.Kind), StableType: e.Type}
		if err := c.check(); err != nil {
			return nil, err
		}
		if _, dup := b[c]; dup {
			return nil, fmt.Errorf("budget counter %s/%q twice", c.Kind, c.StableType)
		}
		if e.Count <= 0 || e.Count > maxBudgetCount {
			return nil, fmt.Errorf("budget count %d is out of range", e.Count)
		}
		b[c] = e.Count
	}
	return b, nil
}

// Encode returns the stored value of s.
func (s BudgetSlice) Encode() string {
	b, _ := json.Marshal(sliceWire{Received: encodeBudget(s.Received), Returned: encodeBudget(s.Returned)})
	return string(b)
}

// DecodeBudgetSlice decodes a budget slice strictly (ErrCorrupt naming the
// key otherwise).
func DecodeBudgetSlice(kv *mvccpb.KeyValue) (BudgetSlice, error) {
	var w sliceWire
	if err := decodeStrict(kv.Value, &w); err != nil {
		return BudgetSlice{}, corrupt(string(kv.Key), err)
	}
	r, err := decodeBudget(w.Received)
	if err != nil {
		return BudgetSlice{}, corrupt(string(kv.Key), err)
	}
	x, err := decodeBudget(w.Returned)
	if err != nil {
		return BudgetSlice{}, corrupt(string(kv.Key), err)
	}
	return BudgetSlice{Received: r, Returned: x}, nil
}

// Encode returns the stored value of l.
func (l BudgetLedger) Encode() string {
	lines := make([]ledgerShardWire, 0, len(l.Shards))
	for _, i := range slices.Sorted(maps.Keys(l.Shards)) {
		sh := l.Shards[i]
		lines = append(lines, ledgerShardWire{Shard: i, Given: encodeBudget(sh.Given), Taken: encodeBudget(sh.Taken)})
	}
	b, _ := json.Marshal(ledgerWire{Shards: &lines})
	return string(b)
}

// DecodeBudgetLedger decodes a ledger strictly (ErrCorrupt naming the key
// otherwise).
func DecodeBudgetLedger(kv *mvccpb.KeyValue) (BudgetLedger, error) {
	l, err := decodeLedger(kv.Value)
	if err != nil {
		return BudgetLedger{}, corrupt(string(kv.Key), err)
	}
	return l, nil
}

func decodeLedger(v []byte) (BudgetLedger, error) {
	var w ledgerWire
	if err := decodeStrict(v, &w); err != nil {
		return BudgetLedger{}, err
	}
	if w.Shards == nil {
		return BudgetLedger{}, errMissingBudget
	}
	l := BudgetLedger{Shards: map[int]LedgerShard{}}
	for _, line := range *w.Shards {
		if line.Shard < 0 || line.Shard >= maxLedgerShards {
			return BudgetLedger{}, fmt.Errorf("ledger shard %d is out of range", line.Shard)
		}
		if _, dup := l.Shards[line.Shard]; dup {
			return BudgetLedger{}, fmt.Errorf("ledger shard %d twice", line.Shard)
		}
		g, err := decodeBudget(line.Given)
		if err != nil {
			return BudgetLedger{}, err
		}
		t, err := decodeBudget(line.Taken)
		if err != nil {
			return BudgetLedger{}, err
		}
		l.Shards[line.Shard] = LedgerShard{Given: g, Taken: t}
	}
	return l, nil
}

// decodeEscrow decodes capacity-escrow/<slices|ledgers>/<esc mesh>/<esc
// rid>/<lifecycle> (rest is the key after "capacity-escrow/").
func (e *Entry) decodeEscrow(rest string, kv *mvccpb.KeyValue) error {
	parts := strings.Split(rest, "/")
	if len(parts) != 4 || (parts[0] != escrowSlices && parts[0] != escrowLedgers) {
		return errBadKey
	}
	var err error
	if e.Node, e.Lifecycle, err = parseNode(parts[1], parts[2], parts[3]); err != nil {
		return err
	}
	if parts[0] == escrowSlices {
		s, err := DecodeBudgetSlice(kv)
		e.BudgetSlice = &s
		return err
	}
	l, err := DecodeBudgetLedger(kv)
	e.BudgetLedger = &l
	return err
}
