package schema

import (
	"bytes"
	"encoding/binary"
	"encoding/gob"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	authority "github.com/zlink-systems/authority"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// rowFormat is the first byte of every encoded row value.
const rowFormat byte = 1

// Row is one decoded state of one authority row: an immutable value once
// built (the cache hands the same pointer to concurrent readers).
type Row struct {
	Key       authority.Key
	ModRev    int64
	CreateRev int64
	OwnerGen  int64 // 0 until written: this write's revision
	Token     int64 // the ownership token; 0 until written: this write's revision
	Owner     authority.OwnerToken
	Alloc     authority.PlacementAllocation
	Pending   *authority.PendingCreation
	Payload   []byte
}

type capacityWire struct {
	Actors int64  `json:"a,omitempty"`
	Spots  int64  `json:"s,omitempty"`
	Kind   string `json:"k,omitempty"`
	Type   string `json:"t,omitempty"`
	Count  int64  `json:"c,omitempty"`
	HasST  bool   `json:"x,omitempty"`
}

type pendingWire struct {
	ReservationID string `json:"id"`
	Reference     string `json:"ref"`
	SHA256        []byte `json:"sha"`
	Size          int64  `json:"n"`
}

type rowWire struct {
	// OwnerGen 0 means "the ModRevision of this value".
	OwnerGen int64 `json:"og,omitempty"`
	// Token is the ownership token; 0 means "the ModRevision of this
	// value". Absent in rows written before tokens existed: the token is
	// then OwnerGen (see decodeRow).
	Token     *int64       `json:"tk,omitempty"`
	OwnerID   string       `json:"o"`
	Lease     int64        `json:"l"`
	State     string       `json:"st"`
	Kind      string       `json:"k"`
	Stable    string       `json:"t"`
	Mesh      string       `json:"m"`
	RID       string       `json:"r"`
	Lifecycle int64        `json:"g"`
	Capacity  capacityWire `json:"c"`
	Pending   *pendingWire `json:"pc,omitempty"`
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
	if err := decodeStrict(v, &w); err != nil {
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

// Encode returns the stored value of r. An OwnerGen or Token of 0 is stored
// as the "own ModRevision" sentinel: the write that changes the owner (or the
// owner lease) sets it, and it reads back as that write's revision.
func (r *Row) Encode() string {
	token := r.Token
	w := rowWire{
		OwnerGen: r.OwnerGen, Token: &token, OwnerID: r.Owner.OwnerID, Lease: r.Owner.LeaseGeneration,
		State: string(r.Alloc.State), Kind: string(r.Alloc.ObjectKind), Stable: r.Alloc.StableType,
		Mesh: r.Alloc.Descriptor.MeshName, RID: r.Alloc.Descriptor.RID,
		Lifecycle: r.Alloc.DescriptorLifecycleGeneration, Capacity: encodeCapacity(r.Alloc.Capacity),
	}
	if p := r.Pending; p != nil {
		w.Pending = &pendingWire{ReservationID: p.ReservationID, Reference: p.RequestContentReference, SHA256: p.RequestSHA256, Size: p.RequestEncodedSize}
	}
	meta, _ := json.Marshal(w)
	var buf bytes.Buffer
	buf.Grow(1 + binary.MaxVarintLen64 + len(meta) + len(r.Payload))
	buf.WriteByte(rowFormat)
	var n [binary.MaxVarintLen64]byte
	buf.Write(n[:binary.PutUvarint(n[:], uint64(len(meta)))])
	buf.Write(meta)
	buf.Write(r.Payload)
	return buf.String()
}

var errBadRow = errors.New("undecodable row")

// DecodeRow decodes a stored row.
func DecodeRow(key authority.Key, kv *mvccpb.KeyValue) (*Row, error) {
	v := kv.Value
	if len(v) < 2 || v[0] != rowFormat {
		return nil, corrupt(string(kv.Key), errBadRow)
	}
	n, sz := binary.Uvarint(v[1:])
	if sz <= 0 || n > uint64(len(v)-1-sz) {
		return nil, corrupt(string(kv.Key), errBadRow)
	}
	meta := v[1+sz : 1+sz+int(n)]
	var w rowWire
	if err := decodeStrict(meta, &w); err != nil {
		return nil, corrupt(string(kv.Key), err)
	}
	if err := w.check(); err != nil {
		return nil, corrupt(string(kv.Key), err)
	}
	r := &Row{
		Key: key, ModRev: kv.ModRevision, CreateRev: kv.CreateRevision, OwnerGen: w.OwnerGen,
		Owner: authority.OwnerToken{OwnerID: w.OwnerID, LeaseGeneration: w.Lease},
		Alloc: authority.PlacementAllocation{
			State: authority.AllocationState(w.State), ObjectKind: authority.ObjectKind(w.Kind), StableType: w.Stable,
			Descriptor:                    authority.NodeDescriptor{MeshName: w.Mesh, RID: w.RID},
			DescriptorLifecycleGeneration: w.Lifecycle, Capacity: w.Capacity.vector(),
		},
		Payload: bytes.Clone(v[1+sz+int(n):]),
	}
	if r.OwnerGen == 0 {
		if kv.ModRevision <= 0 { // no revision to stand for: not a key etcd returned
			return nil, corrupt(string(kv.Key), errBadRow)
		}
		r.OwnerGen = kv.ModRevision
	}
	switch {
	case w.Token == nil: // written before tokens: the last owner change that set ownerGen
		r.Token = r.OwnerGen
	case *w.Token == 0:
		r.Token = kv.ModRevision
	default:
		r.Token = *w.Token
	}
	if r.Token > kv.ModRevision { // a token names this write or an earlier one
		return nil, corrupt(string(kv.Key), errBadRow)
	}
	if p := w.Pending; p != nil {
		r.Pending = &authority.PendingCreation{ReservationID: p.ReservationID, RequestContentReference: p.Reference, RequestSHA256: p.SHA256, RequestEncodedSize: p.Size}
	}
	if r.Alloc.State != authority.AllocationActive && r.Alloc.State != authority.AllocationReserved {
		return nil, corrupt(string(kv.Key), errBadRow)
	}
	return r, nil
}

// Snapshot returns the contract's view of r read at now.
func (r *Row) Snapshot(now time.Time) *authority.Snapshot {
	s := &authority.Snapshot{
		StoreVersion:             Version(r.ModRev),
		Payload:                  bytes.Clone(r.Payload),
		ObjectGeneration:         r.CreateRev,
		AuthorityOwnerGeneration: r.OwnerGen,
		OwnershipToken:           r.Token,
		OwnerID:                  r.Owner.OwnerID,
		OwnerLeaseGeneration:     r.Owner.LeaseGeneration,
		Allocation:               r.Alloc.Clone(),
		StoreNow:                 now,
	}
	if r.Pending != nil {
		p := *r.Pending
		p.RequestSHA256 = bytes.Clone(p.RequestSHA256)
		s.PendingCreation = &p
	}
	return s
}

// Next returns a copy of r as written at revision rev.
func (r *Row) Next(rev int64) *Row {
	c := *r
	c.ModRev = rev
	return &c
}

// Written records that r was stored by the write at revision rev: its
// ModRevision, and the "this write's revision" sentinels (ownerGen, token 0)
// resolved as a read would resolve them.
func (r *Row) Written(rev int64) {
	r.ModRev = rev
	if r.OwnerGen == 0 {
		r.OwnerGen = rev
	}
	if r.Token == 0 {
		r.Token = rev
	}
}

// Version is the StoreVersion of the row value written at revision rev
// ("" for 0: no row).
func Version(rev int64) authority.StoreVersion {
	if rev == 0 {
		return ""
	}
	return authority.StoreVersion(strconv.FormatInt(rev, 10))
}

// ParseVersion returns the ModRevision a version names; ok is false when the
// text is no version of this provider (it then matches no row).
func ParseVersion(v authority.StoreVersion) (int64, bool) {
	if v == "" {
		return 0, true
	}
	n, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil || n <= 0 || Version(n) != v {
		return 0, false
	}
	return n, true
}

// reservationWire is the stored value of a reservation terminal.
type reservationWire struct {
	State     string    `json:"s"`
	ExpiresAt time.Time `json:"e"`
}

// DecodeReservation decodes a reservation terminal strictly.
func DecodeReservation(kv *mvccpb.KeyValue) (ReservationTerminal, error) {
	var w reservationWire
	if err := decodeStrict(kv.Value, &w); err != nil {
		return ReservationTerminal{}, corrupt(string(kv.Key), err)
	}
	if err := w.check(); err != nil {
		return ReservationTerminal{}, corrupt(string(kv.Key), err)
	}
	return ReservationTerminal(w), nil
}

// Encode returns the stored value of r.
func (r ReservationTerminal) Encode() string {
	b, _ := json.Marshal(reservationWire(r))
	return string(b)
}

// operationWire is a creation operation as stored: its own type, so that a
// change to the contract's CreationOperation cannot change stored bytes (the
// JSON names are those the format has always had).
type operationWire struct {
	SourceNodeRID        string `json:"SourceNodeRID"`
	SourceNodeGeneration int64  `json:"SourceNodeGeneration"`
	OperationID          struct {
		High uint64 `json:"High"`
		Low  uint64 `json:"Low"`
	} `json:"OperationID"`
}

func encodeOperation(op authority.CreationOperation) operationWire {
	w := operationWire{SourceNodeRID: op.SourceNodeRID, SourceNodeGeneration: op.SourceNodeGeneration}
	w.OperationID.High, w.OperationID.Low = op.OperationID.High, op.OperationID.Low
	return w
}

func (w operationWire) operation() authority.CreationOperation {
	return authority.CreationOperation{SourceNodeRID: w.SourceNodeRID, SourceNodeGeneration: w.SourceNodeGeneration,
		OperationID: authority.CreationOperationID{High: w.OperationID.High, Low: w.OperationID.Low}}
}

type terminalWire struct {
	State       string        `json:"s"`
	Operation   operationWire `json:"op"`
	Reservation string        `json:"id"`
	Kind        string        `json:"k"`
	Envelope    []byte        `json:"env"`
	EnvelopeSHA []byte        `json:"sha"`
	ExpiresAt   time.Time     `json:"e"`
	StoreNow    time.Time     `json:"now"`
}

// EncodeTerminal returns the stored value of a creation terminal.
func EncodeTerminal(t *authority.TerminalRecord) string {
	b, _ := json.Marshal(terminalWire{
		State: string(t.State), Operation: encodeOperation(t.Operation), Reservation: t.ReservationID, Kind: string(t.ObjectKind),
		Envelope: t.TerminalEnvelope, EnvelopeSHA: t.TerminalEnvelopeSHA256, ExpiresAt: t.ExpiresAt, StoreNow: t.StoreNow,
	})
	return string(b)
}

// DecodeTerminal decodes a creation terminal strictly.
func DecodeTerminal(kv *mvccpb.KeyValue) (*authority.TerminalRecord, error) {
	var w terminalWire
	if err := decodeStrict(kv.Value, &w); err != nil {
		return nil, corrupt(string(kv.Key), err)
	}
	if err := w.check(); err != nil {
		return nil, corrupt(string(kv.Key), err)
	}
	return &authority.TerminalRecord{
		State: authority.TerminalState(w.State), Operation: w.Operation.operation(), ReservationID: w.Reservation,
		ObjectKind: authority.ObjectKind(w.Kind), TerminalEnvelope: w.Envelope, TerminalEnvelopeSHA256: w.EnvelopeSHA,
		ExpiresAt: w.ExpiresAt, StoreNow: w.StoreNow,
	}, nil
}

// AggregateRecord is the stored state of one aggregate. A committed or
// aborted record keeps no participant payloads or membership mutations, and
// expires: it is kept on a bucketed lease and ignored once expired.
type AggregateRecord struct {
	// State is AggregatePrepared, AggregateCommitted or AggregateAborted.
	State string
	// Request is the request that prepared the aggregate.
	Request authority.AggregatePrepareRequest
	// ExpiresAt is when the store stops serving a committed or aborted
	// record; zero for a prepared one, which never expires.
	ExpiresAt time.Time
}

// Aggregate record states.
const (
	AggregatePrepared  = "prepared"
	AggregateCommitted = "committed"
	AggregateAborted   = "aborted"
)

// Aggregate records are stored in format 1: the two bytes aggregateFormat1,
// then aggregateWire as JSON (the store's own types, short field names).
// Format 0, the first, was gob of the Go struct aggregateRecord, which holds
// the contract's AggregatePrepareRequest: renaming a contract field would
// have changed how stored records decode. Format 0 records still decode (a
// gob stream never starts with a NUL byte); the next change of the record
// rewrites it in format 1.
const aggregateFormat1 = "\x00\x01"

type aggregateWire struct {
	State      string            `json:"st"`
	ExpiresAt  time.Time         `json:"e"`
	ID         string            `json:"id"`
	Generation int64             `json:"g"`
	OwnerID    string            `json:"o"`
	Lease      int64             `json:"l"`
	Mesh       string            `json:"m"`
	RID        string            `json:"r"`
	Lifecycle  int64             `json:"lc"`
	Capacity   capacityWire      `json:"c"`
	Digest     []byte            `json:"d"`
	Parts      []participantWire `json:"p"`
}

type participantWire struct {
	Key        string `json:"k"`
	Version    string `json:"v"`
	Transition string `json:"t"`
	Payload    []byte `json:"pl,omitempty"`
	Mutation   []byte `json:"mm,omitempty"`
}

// Encode returns the stored value of a, in format 1.
func (a *AggregateRecord) Encode() string {
	b, _ := json.Marshal(a.wire())
	return aggregateFormat1 + string(b)
}

// wire is the record's format-1 wire form.
func (a *AggregateRecord) wire() *aggregateWire {
	r := &a.Request
	w := aggregateWire{State: a.State, ExpiresAt: a.ExpiresAt, ID: r.AggregateID, Generation: r.AggregateGeneration,
		OwnerID: r.TargetOwner.OwnerID, Lease: r.TargetOwner.LeaseGeneration, Mesh: r.TargetDescriptor.MeshName,
		RID: r.TargetDescriptor.RID, Lifecycle: r.TargetDescriptorLifecycleGeneration,
		Capacity: encodeCapacity(r.Capacity), Digest: r.InventoryDigest, Parts: make([]participantWire, len(r.Participants))}
	for i, p := range r.Participants {
		w.Parts[i] = participantWire{Key: string(p.AuthorityKey), Version: string(p.ExpectedStoreVersion),
			Transition: string(p.OwnerTransition), Payload: p.AuthorityPayload, Mutation: p.MembershipMutation}
	}
	return &w
}

// DecodeAggregate decodes an aggregate record of format 1, or of format 0
// (gob), strictly.
func DecodeAggregate(kv *mvccpb.KeyValue) (*AggregateRecord, error) {
	rest, ok := bytes.CutPrefix(kv.Value, []byte(aggregateFormat1))
	if !ok {
		return decodeAggregateV0(kv)
	}
	var w aggregateWire
	if err := decodeStrict(rest, &w); err != nil {
		return nil, corrupt(string(kv.Key), err)
	}
	if err := w.check(); err != nil {
		return nil, corrupt(string(kv.Key), err)
	}
	a := &AggregateRecord{State: w.State, ExpiresAt: w.ExpiresAt, Request: authority.AggregatePrepareRequest{
		AggregateID: w.ID, AggregateGeneration: w.Generation,
		TargetOwner:      authority.OwnerToken{OwnerID: w.OwnerID, LeaseGeneration: w.Lease},
		TargetDescriptor: authority.NodeDescriptor{MeshName: w.Mesh, RID: w.RID}, TargetDescriptorLifecycleGeneration: w.Lifecycle,
		Capacity: w.Capacity.vector(), InventoryDigest: w.Digest, Participants: make([]authority.AggregateParticipant, len(w.Parts)),
	}}
	for i, p := range w.Parts {
		a.Request.Participants[i] = authority.AggregateParticipant{AuthorityKey: authority.Key(p.Key),
			ExpectedStoreVersion: authority.StoreVersion(p.Version), OwnerTransition: authority.GenerationTransition(p.Transition),
			AuthorityPayload: p.Payload, MembershipMutation: p.Mutation}
	}
	return a, nil
}

// decodeAggregateV0 decodes a record of format 0 (gob), checked as strictly
// as one of format 1.
func decodeAggregateV0(kv *mvccpb.KeyValue) (*AggregateRecord, error) {
	var a AggregateRecord
	if err := gob.NewDecoder(bytes.NewReader(kv.Value)).Decode(&a); err != nil {
		return nil, corrupt(string(kv.Key), err)
	}
	if err := a.wire().check(); err != nil {
		return nil, corrupt(string(kv.Key), err)
	}
	return &a, nil
}

// EncodeOwnerGeneration returns the stored value of an owner generation key:
// the last lease generation handed to the owner, in decimal.
func EncodeOwnerGeneration(gen int64) string { return strconv.FormatInt(gen, 10) }

// DecodeOwnerGeneration decodes an owner generation key's value.
func DecodeOwnerGeneration(kv *mvccpb.KeyValue) (int64, error) {
	gen, err := strconv.ParseInt(string(kv.Value), 10, 64)
	if err != nil || gen < 0 {
		return 0, corrupt(string(kv.Key), fmt.Errorf("owner generation %q", kv.Value))
	}
	return gen, nil
}

// Liveness is the value of an owner liveness key.
type Liveness struct {
	MeshName  string `json:"m"`
	RID       string `json:"r"`
	Lifecycle int64  `json:"g"`
	OwnerID   string `json:"o"`
	Lease     int64  `json:"l"`
}

// DecodeLiveness decodes a liveness key's value strictly.
func DecodeLiveness(value []byte) (Liveness, error) {
	var v Liveness
	if err := decodeStrict(value, &v); err != nil {
		return v, err
	}
	return v, v.check()
}

// Encode returns the stored value of l.
func (l Liveness) Encode() string {
	b, _ := json.Marshal(l)
	return string(b)
}

// EncodeBlob frames a relocation blob: its expiry as 8 bytes of big-endian
// Unix nanoseconds, then the data.
func EncodeBlob(expires time.Time, data []byte) string {
	value := make([]byte, 8, 8+len(data))
	binary.BigEndian.PutUint64(value, uint64(expires.UnixNano()))
	return string(append(value, data...))
}

// DecodeBlob splits a stored relocation blob into its expiry and data (data
// shares kv's bytes).
func DecodeBlob(kv *mvccpb.KeyValue) (time.Time, []byte, error) {
	if len(kv.Value) < 8 {
		return time.Time{}, nil, corrupt(string(kv.Key), errors.New("relocation blob shorter than its expiry"))
	}
	return time.Unix(0, int64(binary.BigEndian.Uint64(kv.Value[:8]))), kv.Value[8:], nil
}
