package schema

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	authority "github.com/zlink-systems/authority"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// capacityWire is a capacity vector as stored in rows, capacity entries and
// aggregate records.
type capacityWire struct {
	Actors int64  `json:"a,omitempty"`
	Spots  int64  `json:"s,omitempty"`
	Kind   string `json:"k,omitempty"`
	Type   string `json:"t,omitempty"`
	Count  int64  `json:"c,omitempty"`
	HasST  bool   `json:"x,omitempty"`
}

func encodeCapacity(c authority.CapacityVector) capacityWire {
	w := capacityWire{Actors: c.Actors, Spots: c.Spots}
	if c.SpotType != nil {
		w.HasST, w.Kind, w.Type, w.Count = true, string(c.SpotType.ObjectKind), c.SpotType.StableType, c.SpotType.Count
	}
	return w
}

func (w capacityWire) vector() authority.CapacityVector {
	c := authority.CapacityVector{Actors: w.Actors, Spots: w.Spots}
	if w.HasST {
		c.SpotType = &authority.SpotTypeCapacity{ObjectKind: authority.ObjectKind(w.Kind), StableType: w.Type, Count: w.Count}
	}
	return c
}

// capacityEntryWire is a capacity index entry: the state of the capacity it
// holds and the vector.
type capacityEntryWire struct {
	State string `json:"st"`
	capacityWire
}

// EncodeCapacityEntry is the value of a capacity entry holding c in state.
func EncodeCapacityEntry(state authority.AllocationState, c authority.CapacityVector) string {
	b, _ := json.Marshal(capacityEntryWire{State: string(state), capacityWire: encodeCapacity(c)})
	return string(b)
}

// DecodeCapacityEntry decodes a capacity entry strictly: its allocation
// state and the capacity it holds.
func DecodeCapacityEntry(v []byte) (authority.AllocationState, authority.CapacityVector, error) {
	var w capacityEntryWire
	var err error
	if rest, ok := bytes.CutPrefix(v, []byte(compactMarker)); ok {
		w, err = decodeCapacityEntryCompact(rest)
	} else {
		err = decodeStrict(v, &w)
	}
	if err != nil {
		return "", authority.CapacityVector{}, err
	}
	st := authority.AllocationState(w.State)
	if st != authority.AllocationReserved && st != authority.AllocationActive {
		return "", authority.CapacityVector{}, fmt.Errorf("capacity state %q", w.State)
	}
	if err := w.check(); err != nil {
		return "", authority.CapacityVector{}, err
	}
	return st, w.vector(), nil
}

// DecodeNodeCapacityEntry decodes kv, one key-value of the range of a node
// lifecycle's capacity entries (nodePrefix is Layout.CapacityNode of that
// lifecycle): its key must name a row's or an aggregate's entry or a row's
// placement key (storeversion.FewerKeys), and its
// value decodes strictly (DecodeCapacityEntry). Any other key or value is an
// error wrapping authority.ErrCorrupt.
func DecodeNodeCapacityEntry(nodePrefix string, kv *mvccpb.KeyValue) (authority.AllocationState, authority.CapacityVector, error) {
	rest, ok := strings.CutPrefix(string(kv.Key), nodePrefix)
	if !ok || !strings.HasPrefix(rest, capRow+"/") && !strings.HasPrefix(rest, capAgg+"/") && !strings.HasPrefix(rest, capOwned+"/") {
		return "", authority.CapacityVector{}, corrupt(string(kv.Key), errBadKey)
	}
	st, c, err := DecodeCapacityEntry(kv.Value)
	if err != nil {
		return "", authority.CapacityVector{}, corrupt(string(kv.Key), err)
	}
	return st, c, nil
}
