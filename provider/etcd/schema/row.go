package schema

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"strconv"
	"time"

	authority "github.com/zlink-systems/authority"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// Row is one decoded state of one authority row: an immutable value once
// built (the cache hands the same pointer to concurrent readers).
type Row struct {
	Key       authority.Key // the row's authority key (from its etcd key)
	ModRev    int64         // the value's ModRevision: its StoreVersion
	CreateRev int64         // the key's CreateRevision: the object generation
	// ObjectGen is the object generation of a row a resharding copied from
	// another shard (storeversion.RowMoves), whose CreateRevision here is
	// another number; 0: CreateRev is the object generation.
	ObjectGen int64
	// MovedVersion is the StoreVersion a row a resharding copied had in
	// the shard it left: the copy is the same state, so it keeps that
	// version until its next write (which takes its own ModRevision, above
	// every revision of the shard it left); 0: ModRev is the version.
	MovedVersion int64
	OwnerGen     int64                         // the owner generation; 0 until written: this write's revision
	Token        int64                         // the ownership token; 0 until written: this write's revision
	Owner        authority.OwnerToken          // the owner and its lease generation
	Alloc        authority.PlacementAllocation // the placement and the capacity it holds
	Pending      *authority.PendingCreation    // a reserved row's creation receipt, else nil
	Payload      []byte                        // the raw payload
	// PlacementKey (storeversion.FewerKeys) says where the row's capacity
	// is held: in its one placement key (Layout.Placement), which also
	// indexes it by owner; when false, in a capacity entry
	// (Layout.CapacityRow) next to an owner index entry (Layout.OwnerRow).
	PlacementKey bool
	// Committed (storeversion.FewerKeys) is the reservation whose commit
	// made this active row, kept until a retry of that commit stops being
	// answered alreadyCommitted; nil for every other row.
	Committed *CommittedReservation
	// Pretend holds the fields of storeversion.NextPretend, which exist
	// only in test builds (tag authority_next); empty otherwise.
	Pretend PretendNext
}

// pendingWire is a reserved row's creation receipt as stored.
type pendingWire struct {
	ReservationID string `json:"id"`
	Reference     string `json:"ref"`
	SHA256        []byte `json:"sha"`
	Size          int64  `json:"n"`
}

// rowWire is the JSON header of a row value (format 1, see format.go). A
// field added to it must give rows written without it their old meaning
// (omitempty, or a pointer when the zero value means something: Token), and
// a golden file of the old row must keep decoding (row-*.v0-no-token).
type rowWire struct {
	// OwnerGen 0 means "the ModRevision of this value".
	OwnerGen int64 `json:"og,omitempty"`
	// Token is the ownership token; 0 means "the ModRevision of this
	// value". Absent in rows written before tokens existed: the token is
	// then OwnerGen (see DecodeRow).
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
	// ObjectGen and MovedVersion are Row's (storeversion.RowMoves): absent
	// in every row no resharding copied.
	ObjectGen    int64 `json:"cg,omitempty"`
	MovedVersion int64 `json:"mv,omitempty"`
	// the fields of storeversion.FewerKeys exist in the compact format
	// only: format 1 never holds them
	PlacementKey bool                  `json:"-"`
	Committed    *CommittedReservation `json:"-"`
	pretendWire
}

// Encode returns the stored value of r in format 1. An OwnerGen or Token of
// 0 is stored as the "own ModRevision" sentinel: the write that changes the
// owner (or the owner lease) sets it, and it reads back as that write's
// revision. Format 1 has no field of storeversion.FewerKeys: a writer goes
// through EncodeAt, which keeps them.
func (r *Row) Encode() string {
	token := r.Token
	w := rowWire{
		OwnerGen: r.OwnerGen, Token: &token, OwnerID: r.Owner.OwnerID, Lease: r.Owner.LeaseGeneration,
		State: string(r.Alloc.State), Kind: string(r.Alloc.ObjectKind), Stable: r.Alloc.StableType,
		Mesh: r.Alloc.Descriptor.MeshName, RID: r.Alloc.Descriptor.RID,
		Lifecycle: r.Alloc.DescriptorLifecycleGeneration, Capacity: encodeCapacity(r.Alloc.Capacity),
		ObjectGen: r.ObjectGen, MovedVersion: r.MovedVersion, pretendWire: r.Pretend.wire(),
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
	if len(v) < 2 || v[0] != rowFormat && v[0] != rowFormatCompact {
		return nil, corrupt(string(kv.Key), errBadRow)
	}
	n, sz := binary.Uvarint(v[1:])
	if sz <= 0 || n > uint64(len(v)-1-sz) {
		return nil, corrupt(string(kv.Key), errBadRow)
	}
	meta := v[1+sz : 1+sz+int(n)]
	w, err := decodeRowMeta(v[0], meta)
	if err != nil {
		return nil, corrupt(string(kv.Key), err)
	}
	if err := w.check(); err != nil {
		return nil, corrupt(string(kv.Key), err)
	}
	r := &Row{
		Key: key, ModRev: kv.ModRevision, CreateRev: kv.CreateRevision, ObjectGen: w.ObjectGen, MovedVersion: w.MovedVersion, OwnerGen: w.OwnerGen,
		Owner: authority.OwnerToken{OwnerID: w.OwnerID, LeaseGeneration: w.Lease},
		Alloc: authority.PlacementAllocation{
			State: authority.AllocationState(w.State), ObjectKind: authority.ObjectKind(w.Kind), StableType: w.Stable,
			Descriptor:                    authority.NodeDescriptor{MeshName: w.Mesh, RID: w.RID},
			DescriptorLifecycleGeneration: w.Lifecycle, Capacity: w.Capacity.vector(),
		},
		Payload:      bytes.Clone(v[1+sz+int(n):]),
		PlacementKey: w.PlacementKey,
		Committed:    w.Committed,
		Pretend:      w.pretendWire.row(),
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
	if r.Token > kv.ModRevision || r.ObjectGen > kv.ModRevision || r.MovedVersion >= kv.ModRevision { // they name earlier writes (a token: this one or an earlier)
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

// decodeRowMeta decodes a row's metadata of format f (rowFormat or
// rowFormatCompact) into the format-1 wire form.
func decodeRowMeta(f byte, meta []byte) (*rowWire, error) {
	if f == rowFormatCompact {
		return decodeRowMetaCompact(meta)
	}
	var w rowWire
	if err := decodeStrict(meta, &w); err != nil {
		return nil, err
	}
	return &w, nil
}

// Snapshot returns the contract's view of r read at now.
func (r *Row) Snapshot(now time.Time) *authority.Snapshot {
	s := &authority.Snapshot{
		StoreVersion:             r.Version(),
		Payload:                  bytes.Clone(r.Payload),
		ObjectGeneration:         r.Generation(),
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

// Generation returns r's object generation: ObjectGen when a resharding
// copied it, else its key's CreateRevision.
func (r *Row) Generation() int64 {
	if r.ObjectGen != 0 {
		return r.ObjectGen
	}
	return r.CreateRev
}

// Version returns r's StoreVersion: MovedVersion when a resharding copied
// it (and nothing wrote it since), else its ModRevision.
func (r *Row) Version() authority.StoreVersion {
	if r.MovedVersion != 0 {
		return Version(r.MovedVersion)
	}
	return Version(r.ModRev)
}

// Moved returns r as a resharding copies it into another shard: its
// version, object generation, owner generation and ownership token stated
// as numbers (the "this write's revision" sentinels resolved), since the
// copy's revisions in the other cluster are other numbers.
func (r *Row) Moved() *Row {
	c := *r
	c.ObjectGen = r.Generation()
	c.MovedVersion = r.MovedVersion
	if c.MovedVersion == 0 {
		c.MovedVersion = r.ModRev
	}
	return &c
}

// Next returns a copy of r as written at revision rev: a write gives it a
// version of its own (a copied row's MovedVersion ends).
func (r *Row) Next(rev int64) *Row {
	c := *r
	c.ModRev, c.MovedVersion = rev, 0
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
