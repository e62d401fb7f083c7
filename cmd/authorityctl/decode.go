package main

// Decoding of raw etcd values written by provider/etcd, for the inspections
// the Store API does not offer (watch, owners, capacity, terminals,
// aggregates, reservations). The formats follow the key layout documented in
// provider/etcd's package comment and its codec.

import (
	"bytes"
	"encoding/binary"
	"encoding/gob"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	authority "github.com/zlink-systems/authority"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// Key segments of the provider's layout under the namespace.
const (
	segRows         = "rows/"
	segOwners       = "owners/"
	segOwnerRows    = "owner-rows/"
	segCapacity     = "capacity/"
	segReservations = "reservations/"
	segTerminals    = "terminals/"
	segAggregates   = "aggregates/"
)

// rowFormat is the first byte of a stored row (provider/etcd codec).
const rowFormat byte = 1

type wireCapacity struct {
	Actors int64  `json:"a,omitempty"`
	Spots  int64  `json:"s,omitempty"`
	Kind   string `json:"k,omitempty"`
	Type   string `json:"t,omitempty"`
	Count  int64  `json:"c,omitempty"`
	HasST  bool   `json:"x,omitempty"`
}

func (w wireCapacity) vector() authority.CapacityVector {
	c := authority.CapacityVector{Actors: w.Actors, Spots: w.Spots}
	if w.HasST {
		c.SpotType = &authority.SpotTypeCapacity{ObjectKind: authority.ObjectKind(w.Kind), StableType: w.Type, Count: w.Count}
	}
	return c
}

type wireRow struct {
	OwnerGen  int64        `json:"og,omitempty"`
	OwnerID   string       `json:"o"`
	Lease     int64        `json:"l"`
	State     string       `json:"st"`
	Kind      string       `json:"k"`
	Stable    string       `json:"t"`
	Mesh      string       `json:"m"`
	RID       string       `json:"r"`
	Lifecycle int64        `json:"g"`
	Capacity  wireCapacity `json:"c"`
	Pending   *struct {
		ReservationID string `json:"id"`
		Reference     string `json:"ref"`
		SHA256        []byte `json:"sha"`
		Size          int64  `json:"n"`
	} `json:"pc,omitempty"`
}

var errUndecodable = errors.New("undecodable value")

// decodeRow decodes a stored row into the snapshot ReadAuthority would
// return for it.
func decodeRow(kv *mvccpb.KeyValue) (*authority.Snapshot, error) {
	v := kv.Value
	if len(v) < 2 || v[0] != rowFormat {
		return nil, fmt.Errorf("row %q: %w", kv.Key, errUndecodable)
	}
	n, sz := binary.Uvarint(v[1:])
	if sz <= 0 || n > uint64(len(v)-1-sz) {
		return nil, fmt.Errorf("row %q: %w", kv.Key, errUndecodable)
	}
	var w wireRow
	if err := json.Unmarshal(v[1+sz:1+sz+int(n)], &w); err != nil {
		return nil, fmt.Errorf("row %q: %w", kv.Key, err)
	}
	s := &authority.Snapshot{
		StoreVersion:             authority.StoreVersion(strconv.FormatInt(kv.ModRevision, 10)),
		Payload:                  bytes.Clone(v[1+sz+int(n):]),
		ObjectGeneration:         kv.CreateRevision,
		AuthorityOwnerGeneration: w.OwnerGen,
		OwnerID:                  w.OwnerID,
		OwnerLeaseGeneration:     w.Lease,
		Allocation: authority.PlacementAllocation{
			State: authority.AllocationState(w.State), ObjectKind: authority.ObjectKind(w.Kind), StableType: w.Stable,
			Descriptor:                    authority.NodeDescriptor{MeshName: w.Mesh, RID: w.RID},
			DescriptorLifecycleGeneration: w.Lifecycle, Capacity: w.Capacity.vector(),
		},
	}
	if s.AuthorityOwnerGeneration == 0 {
		s.AuthorityOwnerGeneration = kv.ModRevision // "my own ModRevision"
	}
	if p := w.Pending; p != nil {
		s.PendingCreation = &authority.PendingCreation{ReservationID: p.ReservationID, RequestContentReference: p.Reference,
			RequestSHA256: p.SHA256, RequestEncodedSize: p.Size}
	}
	return s, nil
}

// wireLiveness is the value of an owner liveness key.
type wireLiveness struct {
	MeshName  string `json:"m"`
	RID       string `json:"r"`
	Lifecycle int64  `json:"g"`
	OwnerID   string `json:"o"`
	Lease     int64  `json:"l"`
}

func decodeLiveness(kv *mvccpb.KeyValue) (wireLiveness, error) {
	var l wireLiveness
	if err := json.Unmarshal(kv.Value, &l); err != nil {
		return l, fmt.Errorf("owner key %q: %w", kv.Key, err)
	}
	return l, nil
}

// capacityKey is a parsed capacity index key:
// capacity/<esc mesh>/<esc rid>/<lifecycle>/row|agg/<rest>.
type capacityKey struct {
	node      authority.NodeDescriptor
	lifecycle int64
	holder    string // "row" or "agg"
	name      string // authority key, or <esc aggregate ID>/<generation>
}

func parseCapacityKey(rest string) (capacityKey, error) {
	parts := strings.SplitN(rest, "/", 5)
	if len(parts) != 5 {
		return capacityKey{}, errUndecodable
	}
	mesh, err1 := url.PathUnescape(parts[0])
	rid, err2 := url.PathUnescape(parts[1])
	lc, err3 := strconv.ParseInt(parts[2], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || (parts[3] != "row" && parts[3] != "agg") {
		return capacityKey{}, errUndecodable
	}
	return capacityKey{node: authority.NodeDescriptor{MeshName: mesh, RID: rid}, lifecycle: lc, holder: parts[3], name: parts[4]}, nil
}

// wireCapacityEntry is a capacity entry's value: the state of the capacity
// it holds and the vector.
type wireCapacityEntry struct {
	State string `json:"st"`
	wireCapacity
}

func decodeCapacity(kv *mvccpb.KeyValue) (authority.AllocationState, authority.CapacityVector, error) {
	var w wireCapacityEntry
	if err := json.Unmarshal(kv.Value, &w); err != nil {
		return "", authority.CapacityVector{}, fmt.Errorf("capacity key %q: %w", kv.Key, err)
	}
	st := authority.AllocationState(w.State)
	if st != authority.AllocationActive && st != authority.AllocationReserved {
		return "", authority.CapacityVector{}, fmt.Errorf("capacity key %q: state %q: %w", kv.Key, w.State, errUndecodable)
	}
	return st, w.vector(), nil
}

// wireReservation is a reservation terminal.
type wireReservation struct {
	State     string    `json:"s"`
	ExpiresAt time.Time `json:"e"`
}

// wireTerminal is a creation terminal.
type wireTerminal struct {
	State       string                      `json:"s"`
	Operation   authority.CreationOperation `json:"op"`
	Reservation string                      `json:"id"`
	Kind        string                      `json:"k"`
	Envelope    []byte                      `json:"env"`
	EnvelopeSHA []byte                      `json:"sha"`
	ExpiresAt   time.Time                   `json:"e"`
	StoreNow    time.Time                   `json:"now"`
}

// wireAggregate is an aggregate record (gob, matched by field names).
type wireAggregate struct {
	State   string
	Request authority.AggregatePrepareRequest
}

func decodeAggregate(kv *mvccpb.KeyValue) (*wireAggregate, error) {
	var a wireAggregate
	if err := gob.NewDecoder(bytes.NewReader(kv.Value)).Decode(&a); err != nil {
		return nil, fmt.Errorf("aggregate key %q: %w", kv.Key, err)
	}
	return &a, nil
}

func unescape(s string) string {
	if u, err := url.PathUnescape(s); err == nil {
		return u
	}
	return s
}

func jsonValue(kv *mvccpb.KeyValue, v any) error {
	if err := json.Unmarshal(kv.Value, v); err != nil {
		return fmt.Errorf("key %q: %w", kv.Key, err)
	}
	return nil
}

func esc(s string) string { return url.PathEscape(s) }
