package schema

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	authority "github.com/zlink-systems/authority"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// The layout segments of cross-shard aggregates (storeversion.RowLocks):
// the row locks a commit holds on its participants in their shards, and the
// marker a shard leaves when it applied its part.
const (
	SegRowLocks       = "row-locks"
	SegAggregateParts = "aggregate-parts"
)

// RowLocksPrefix is the prefix of every row lock.
func (l Layout) RowLocksPrefix() string { return l.ns + SegRowLocks + "/" }

// RowLock is the key of the row lock of the row at key. It sits outside the
// rows range, so listings and the row feed never see it; every write of an
// existing row compares it absent.
func (l Layout) RowLock(key authority.Key) string { return l.ns + SegRowLocks + "/" + string(key) }

// AggregatePart is the key of the marker a participant shard writes when it
// applies its part of a committed cross-shard aggregate.
func (l Layout) AggregatePart(f authority.Fence) string {
	return l.ns + SegAggregateParts + "/" + esc(f.AggregateID) + "/" + itoa(f.AggregateGeneration)
}

// RowLock is the value of a row lock: which commit attempt of which
// cross-shard aggregate holds the row.
type RowLock struct {
	// Fence is the aggregate's.
	Fence authority.Fence
	// Incarnation is the aggregate record's incarnation (a random ID the
	// prepare gave it): a fence prepared again after its record expired is
	// another incarnation, and a lock of the earlier one is left over.
	Incarnation string
	// Attempt is the random ID of the commit attempt that wrote the lock.
	Attempt string
	// Base is the aggregate record's ModRevision the attempt started from:
	// the attempt may decide only while the record is still at Base.
	Base int64
}

// rowLockWire is a row lock as stored (one JSON object).
type rowLockWire struct {
	ID   string `json:"id"`
	Gen  int64  `json:"g"`
	Inc  string `json:"i"`
	Att  string `json:"a"`
	Base int64  `json:"b"`
}

// Encode returns the stored value of l.
func (l RowLock) Encode() string {
	b, _ := json.Marshal(rowLockWire{ID: l.Fence.AggregateID, Gen: l.Fence.AggregateGeneration, Inc: l.Incarnation, Att: l.Attempt, Base: l.Base})
	return string(b)
}

// DecodeRowLock decodes a stored row lock strictly.
func DecodeRowLock(kv *mvccpb.KeyValue) (RowLock, error) {
	var w rowLockWire
	if err := decodeStrict(kv.Value, &w); err != nil {
		return RowLock{}, corrupt(string(kv.Key), err)
	}
	if err := storedText(w.ID, "aggregate ID"); err != nil {
		return RowLock{}, corrupt(string(kv.Key), err)
	}
	if w.Gen < 1 || w.Base < 1 || !idText(w.Inc) || !idText(w.Att) {
		return RowLock{}, corrupt(string(kv.Key), errors.New("row lock generation, base, incarnation or attempt out of range"))
	}
	return RowLock{Fence: authority.Fence{AggregateID: w.ID, AggregateGeneration: w.Gen}, Incarnation: w.Inc, Attempt: w.Att, Base: w.Base}, nil
}

// idText reports whether s is a random ID as the store makes them: 1 to 64
// lowercase hex digits.
func idText(s string) bool {
	return len(s) > 0 && len(s) <= 64 && strings.Trim(s, "0123456789abcdef") == ""
}

// AggregatePart is the value of a part marker: the incarnation whose part
// the shard applied, and the ownership tokens its newOwner rows got (0: the
// marker's ModRevision, the revision of the Txn that applied the part).
type AggregatePart struct {
	// Incarnation is the applied record's.
	Incarnation string
	// Tokens are the newOwner rows' ownership tokens, by key.
	Tokens map[authority.Key]int64
}

// aggregatePartWire is a part marker as stored (one JSON object).
type aggregatePartWire struct {
	Inc    string           `json:"i"`
	Tokens map[string]int64 `json:"t,omitempty"`
}

// Encode returns the stored value of p.
func (p AggregatePart) Encode() string {
	w := aggregatePartWire{Inc: p.Incarnation}
	if len(p.Tokens) > 0 {
		w.Tokens = make(map[string]int64, len(p.Tokens))
		for k, v := range p.Tokens {
			w.Tokens[string(k)] = v
		}
	}
	b, _ := json.Marshal(w)
	return string(b)
}

// DecodeAggregatePart decodes a stored part marker strictly; a token of 0
// reads as the marker's ModRevision.
func DecodeAggregatePart(kv *mvccpb.KeyValue) (AggregatePart, error) {
	var w aggregatePartWire
	if err := decodeStrict(kv.Value, &w); err != nil {
		return AggregatePart{}, corrupt(string(kv.Key), err)
	}
	if !idText(w.Inc) {
		return AggregatePart{}, corrupt(string(kv.Key), errors.New("part marker incarnation out of range"))
	}
	p := AggregatePart{Incarnation: w.Inc, Tokens: make(map[authority.Key]int64, len(w.Tokens))}
	for k, v := range w.Tokens {
		if err := storedText(k, "participant key"); err != nil {
			return AggregatePart{}, corrupt(string(kv.Key), err)
		}
		if v < 0 {
			return AggregatePart{}, corrupt(string(kv.Key), fmt.Errorf("token %d of %q is negative", v, k))
		}
		if v == 0 {
			v = kv.ModRevision
		}
		p.Tokens[authority.Key(k)] = v
	}
	return p, nil
}
