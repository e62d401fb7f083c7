package schema

//go:generate protoc --go_out=. --go_opt=paths=source_relative internal/compactpb/compact.proto

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/provider/etcd/schema/internal/compactpb"
	"github.com/zlink-systems/authority/provider/etcd/storeversion"
)

// The compact format (storeversion.CompactFormat) of row metadata and
// capacity entries: protobuf messages (internal/compactpb/compact.proto)
// behind a marker, where format 1 was JSON with field names. Decoding is as
// strict as format 1's: an unknown field (in any message), an unknown enum
// value and every range check of format 1 are errors.

// Compact reports whether a namespace at active version v writes the
// compact format: the one place a writer asks which format to write.
func Compact(v storeversion.Version) bool { return v >= storeversion.CompactFormat }

// EncodeAt returns the stored value of r in the format of active version v.
// A row with a field of storeversion.FewerKeys (which only a namespace
// finalized there holds) keeps it, in the compact format, whatever v is: a
// writer that has not yet learned the version its namespace moved to must
// not drop where the row's capacity is or which reservation committed it.
func (r *Row) EncodeAt(v storeversion.Version) string {
	if !Compact(v) && !r.fewerKeys() {
		return r.Encode()
	}
	m := &compactpb.Row{
		OwnerGen: r.OwnerGen, Token: r.Token, OwnerId: []byte(r.Owner.OwnerID), Lease: r.Owner.LeaseGeneration,
		State: stateToCompact(r.Alloc.State), Kind: kindToCompact(r.Alloc.ObjectKind),
		StableType: []byte(r.Alloc.StableType), Mesh: []byte(r.Alloc.Descriptor.MeshName),
		Rid: []byte(r.Alloc.Descriptor.RID), Lifecycle: r.Alloc.DescriptorLifecycleGeneration,
		Capacity: capacityToCompact(r.Alloc.Capacity), NextWrites: r.Pretend.wire().compact(),
		PlacementKey: r.PlacementKey, Committed: committedToCompact(r.Committed),
		ObjectGen: r.ObjectGen, MovedVersion: r.MovedVersion,
	}
	if p := r.Pending; p != nil {
		m.Pending = &compactpb.Pending{ReservationId: []byte(p.ReservationID), Reference: []byte(p.RequestContentReference),
			Sha256: p.RequestSHA256, Size: p.RequestEncodedSize}
	}
	meta := marshalCompact(m)
	var buf bytes.Buffer
	buf.Grow(1 + binary.MaxVarintLen64 + len(meta) + len(r.Payload))
	buf.WriteByte(rowFormatCompact)
	var n [binary.MaxVarintLen64]byte
	buf.Write(n[:binary.PutUvarint(n[:], uint64(len(meta)))])
	buf.Write(meta)
	buf.Write(r.Payload)
	return buf.String()
}

// decodeRowMetaCompact decodes compact row metadata into the format-1 wire
// form, which DecodeRow then checks and converts as it does format 1.
func decodeRowMetaCompact(meta []byte) (*rowWire, error) {
	var m compactpb.Row
	if err := unmarshalCompact(meta, &m); err != nil {
		return nil, err
	}
	pw, err := pretendFromCompact(m.NextWrites)
	if err != nil {
		return nil, err
	}
	capacity := capacityFromCompact(m.Capacity)
	committed, err := committedFromCompact(m.Committed)
	if err != nil {
		return nil, err
	}
	token := m.Token
	w := &rowWire{
		OwnerGen: m.OwnerGen, Token: &token, OwnerID: string(m.OwnerId), Lease: m.Lease,
		State: stateFromCompact(m.State), Kind: kindFromCompact(m.Kind), Stable: string(m.StableType),
		Mesh: string(m.Mesh), RID: string(m.Rid), Lifecycle: m.Lifecycle, Capacity: capacity, pretendWire: pw,
		PlacementKey: m.PlacementKey, Committed: committed, ObjectGen: m.ObjectGen, MovedVersion: m.MovedVersion,
	}
	if p := m.Pending; p != nil {
		w.Pending = &pendingWire{ReservationID: string(p.ReservationId), Reference: string(p.Reference), SHA256: p.Sha256, Size: p.Size}
	}
	return w, nil
}

// EncodeCapacityEntryAt is the value of a capacity entry holding c in state,
// in the format of active version v.
func EncodeCapacityEntryAt(v storeversion.Version, state authority.AllocationState, c authority.CapacityVector) string {
	if !Compact(v) {
		return EncodeCapacityEntry(state, c)
	}
	cw := capacityToCompact(c)
	return compactMarker + string(marshalCompact(&compactpb.CapacityEntry{
		State: stateToCompact(state), Actors: cw.Actors, Spots: cw.Spots, SpotType: cw.SpotType}))
}

// decodeCapacityEntryCompact decodes a compact capacity entry (after its
// marker) into the format-1 wire form.
func decodeCapacityEntryCompact(v []byte) (capacityEntryWire, error) {
	var m compactpb.CapacityEntry
	if err := unmarshalCompact(v, &m); err != nil {
		return capacityEntryWire{}, err
	}
	c := capacityFromCompact(&compactpb.Capacity{Actors: m.Actors, Spots: m.Spots, SpotType: m.SpotType})
	return capacityEntryWire{State: stateFromCompact(m.State), capacityWire: c}, nil
}

func capacityToCompact(c authority.CapacityVector) *compactpb.Capacity {
	m := &compactpb.Capacity{Actors: c.Actors, Spots: c.Spots}
	if st := c.SpotType; st != nil {
		m.SpotType = &compactpb.SpotType{Kind: kindToCompact(st.ObjectKind), StableType: []byte(st.StableType), Count: st.Count}
	}
	return m
}

// capacityFromCompact converts a compact capacity vector (absent: zero);
// capacityWire.check then refuses what format 1 refuses.
func capacityFromCompact(m *compactpb.Capacity) capacityWire {
	if m == nil {
		return capacityWire{}
	}
	w := capacityWire{Actors: m.Actors, Spots: m.Spots}
	if st := m.SpotType; st != nil {
		w.HasST, w.Kind, w.Type, w.Count = true, kindFromCompact(st.Kind), string(st.StableType), st.Count
	}
	return w
}

var states = []struct {
	c compactpb.State
	s authority.AllocationState
}{{compactpb.State_RESERVED, authority.AllocationReserved}, {compactpb.State_ACTIVE, authority.AllocationActive}}

var kinds = []struct {
	c compactpb.Kind
	k authority.ObjectKind
}{{compactpb.Kind_ACTOR, authority.ObjectActor}, {compactpb.Kind_USER_SPOT, authority.ObjectUserSpot},
	{compactpb.Kind_INSTANCE_SPOT, authority.ObjectInstanceSpot}}

// stateToCompact maps a state; one no operation stores maps to
// STATE_UNSPECIFIED, which the decoder refuses.
func stateToCompact(s authority.AllocationState) compactpb.State {
	for _, e := range states {
		if e.s == s {
			return e.c
		}
	}
	return compactpb.State_STATE_UNSPECIFIED
}

// stateFromCompact maps a stored state; an unknown one maps to a text the
// format-1 checks refuse, naming the number.
func stateFromCompact(c compactpb.State) string {
	for _, e := range states {
		if e.c == c {
			return string(e.s)
		}
	}
	return fmt.Sprintf("compact state %d", int32(c))
}

func kindToCompact(k authority.ObjectKind) compactpb.Kind {
	for _, e := range kinds {
		if e.k == k {
			return e.c
		}
	}
	return compactpb.Kind_KIND_UNSPECIFIED
}

func kindFromCompact(c compactpb.Kind) string {
	for _, e := range kinds {
		if e.c == c {
			return string(e.k)
		}
	}
	return fmt.Sprintf("compact kind %d", int32(c))
}

// marshalCompact encodes m deterministically; the messages hold no string
// fields (text is bytes) and no maps, so it cannot fail.
func marshalCompact(m proto.Message) []byte {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		panic("etcd provider bug: compact value does not encode: " + err.Error())
	}
	return b
}

var errUnknownCompactField = errors.New("compact value has a field this build does not know")

// unmarshalCompact decodes data into m strictly: any unknown field, in m or
// in a message it holds, is an error (a later format's field, refused as
// format 1 refuses unknown JSON fields).
func unmarshalCompact(data []byte, m proto.Message) error {
	if err := (proto.UnmarshalOptions{RecursionLimit: 8}).Unmarshal(data, m); err != nil {
		return err
	}
	return rejectUnknown(m.ProtoReflect())
}

func rejectUnknown(m protoreflect.Message) error {
	if len(m.GetUnknown()) > 0 {
		return errUnknownCompactField
	}
	var err error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Message() != nil && !fd.IsList() && !fd.IsMap() {
			err = rejectUnknown(v.Message())
		}
		return err == nil
	})
	return err
}

// RowFormat returns the format of a stored row value: 1 (JSON metadata), 2
// (compact), or 0 for a value that is neither. Tools and tests that report
// how much of a namespace is in which format use it; readers go through
// DecodeRow.
func RowFormat(v []byte) int {
	switch {
	case len(v) > 0 && v[0] == rowFormat:
		return 1
	case len(v) > 0 && v[0] == rowFormatCompact:
		return 2
	}
	return 0
}

// RowCarriesPretendField reports whether a stored row value carries the
// field of storeversion.NextPretend (test builds only write it): the
// upgrade-gate tests find such rows with it, then check that a released
// build refuses them.
func RowCarriesPretendField(v []byte) bool {
	switch RowFormat(v) {
	case 1:
		return bytes.Contains(v, []byte(`"nx":`))
	case 2:
		n, sz := binary.Uvarint(v[1:])
		if sz <= 0 || n > uint64(len(v)-1-sz) {
			return false
		}
		var m compactpb.Row
		return proto.Unmarshal(v[1+sz:1+sz+int(n)], &m) == nil && m.NextWrites != 0
	}
	return false
}
