package schema

import (
	"bytes"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/provider/etcd/storeversion"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// EntryKind names what one key under a store's namespace holds (see the
// key layout in the package comment).
type EntryKind int

// Entry kinds.
const (
	// EntryUnknown is a key outside the namespace or under no segment of
	// the layout (for example a tool's scratch key).
	EntryUnknown EntryKind = iota
	// EntryRow is an authority row.
	EntryRow
	// EntryOwnerLiveness is an owner's liveness key, attached to its lease.
	EntryOwnerLiveness
	// EntryOwnerGeneration is the last lease generation handed to an owner.
	EntryOwnerGeneration
	// EntryOwnerIndex is the owner index entry of one row.
	EntryOwnerIndex
	// EntryCapacity is the capacity index entry of a row or an aggregate.
	EntryCapacity
	// EntryReservation is a reservation terminal.
	EntryReservation
	// EntryTerminal is a creation terminal.
	EntryTerminal
	// EntryAggregate is an aggregate record.
	EntryAggregate
	// EntryBlob is a relocation blob.
	EntryBlob
	// EntryCapacityEpoch is a node lifecycle's capacity epoch: an empty
	// value whose ModRevision is the revision of the node's last capacity
	// change.
	EntryCapacityEpoch
	// EntryStoreVersion is the namespace's active store version
	// (ActiveVersion set) or a running process's announcement
	// (Announcement set).
	EntryStoreVersion
	// EntryEscrow is a node lifecycle's capacity escrow key: its budget
	// slice in this shard (BudgetSlice set) or its ledger (BudgetLedger
	// set).
	EntryEscrow
	// EntryRowLock is a cross-shard aggregate's lock on a row (Key, and
	// RowLock its value).
	EntryRowLock
	// EntryAggregatePart is the marker of a cross-shard aggregate's part
	// applied in this shard (Fence, and Part its value).
	EntryAggregatePart
	// EntryShardMap is the shard map of a store over several etcd
	// clusters (ShardMap set).
	EntryShardMap
	// EntryOwnerNode is an owner directory key (storeversion.FewerKeys): an
	// owner lease generation (Owner) may hold placement keys on a node
	// lifecycle (Node, Lifecycle). Its value is empty.
	EntryOwnerNode
)

var entryKindNames = [...]string{"unknown", "row", "owner liveness", "owner generation", "owner index",
	"capacity", "reservation terminal", "creation terminal", "aggregate", "blob", "capacity epoch", "store version",
	"capacity escrow", "row lock", "aggregate part", "shard map", "owner directory"}

// String returns the kind's name ("row", "capacity", ...).
func (k EntryKind) String() string {
	if k < 0 || int(k) >= len(entryKindNames) {
		return "EntryKind(" + strconv.Itoa(int(k)) + ")"
	}
	return entryKindNames[k]
}

// segments are the first path segment of every kind's keys ("rows/", ...):
// the layout's segment constants (keys.go).
var segments = map[EntryKind]string{
	EntryRow:             SegRows + "/",
	EntryOwnerLiveness:   SegOwners + "/",
	EntryOwnerGeneration: SegOwnerGens + "/",
	EntryOwnerIndex:      SegOwnerRows + "/",
	EntryCapacity:        SegCapacity + "/",
	EntryReservation:     SegReservations + "/",
	EntryTerminal:        SegTerminals + "/",
	EntryAggregate:       SegAggregates + "/",
	EntryBlob:            SegBlobs + "/",
	EntryCapacityEpoch:   SegCapacityEpochs + "/",
	EntryStoreVersion:    SegStoreVersion + "/",
	EntryEscrow:          SegEscrow + "/",
	EntryRowLock:         SegRowLocks + "/",
	EntryAggregatePart:   SegAggregateParts + "/",
	EntryShardMap:        SegShardMap + "/",
	EntryOwnerNode:       SegOwnerNodes + "/",
}

// Prefix returns the prefix of every key of kind k under namespace (for
// example namespace+"capacity/"), to range over them. For EntryUnknown it
// returns namespace itself, the prefix of every key of the store.
func Prefix(namespace string, k EntryKind) string { return namespace + segments[k] }

// OwnerLivenessPrefix returns the prefix of the liveness keys of one owner
// lease generation (one per node lifecycle it is live on).
func OwnerLivenessPrefix(namespace string, owner authority.OwnerToken) string {
	return Layout{ns: namespace}.LivenessPrefix(owner)
}

// OwnerIndexPrefix returns the prefix of the owner index entries of the rows
// one owner lease generation holds.
func OwnerIndexPrefix(namespace string, owner authority.OwnerToken) string {
	return Layout{ns: namespace}.OwnerRowsPrefix(owner)
}

// CapacityNodePrefix returns the prefix of the capacity entries of one node
// lifecycle.
func CapacityNodePrefix(namespace string, node authority.NodeDescriptor, lifecycle int64) string {
	return Layout{ns: namespace}.CapacityNode(node, lifecycle)
}

// Entry is one decoded key-value of a store's namespace: its kind, the parts
// of its key and its decoded value. Only the fields its kind names are set.
type Entry struct {
	// Kind is what the key holds; EntryUnknown sets no other field.
	Kind EntryKind

	// Key is the authority key of a row, of an owner index entry and of a
	// row's capacity entry (or placement key).
	Key authority.Key
	// Owner is the owner of a liveness key, of an owner index entry, of a
	// placement key and of an owner directory key; for an owner
	// generation, the owner with the last lease generation handed to it.
	Owner authority.OwnerToken
	// Node and Lifecycle are the node lifecycle of a liveness key, of a
	// capacity entry, of a capacity epoch and of an owner directory key.
	Node      authority.NodeDescriptor
	Lifecycle int64
	// Fence is the aggregate of an aggregate record and of an aggregate's
	// capacity entry.
	Fence authority.Fence
	// ReservationID is the reservation of a reservation terminal.
	ReservationID string
	// BlobReference is the reference of a relocation blob.
	BlobReference authority.BlobReference

	// Snapshot is a row as ReadAuthority returns it, except StoreNow (zero:
	// decoding reads no clock).
	Snapshot *authority.Snapshot
	// Capacity is a capacity entry's value.
	Capacity *CapacityEntry
	// Reservation is a reservation terminal's value.
	Reservation *ReservationTerminal
	// Terminal is a creation terminal.
	Terminal *authority.TerminalRecord
	// Aggregate is an aggregate record.
	Aggregate *AggregateRecord
	// Blob is a relocation blob.
	Blob *Blob
	// ActiveVersion is the namespace's active store version (the
	// active-version key).
	ActiveVersion storeversion.Version
	// Announcement is a running process's announcement; Lease is the etcd
	// lease it is attached to.
	Announcement *Announcement
	Lease        int64
	// BudgetSlice and BudgetLedger are a capacity escrow key's value.
	BudgetSlice  *BudgetSlice
	BudgetLedger *BudgetLedger
	// RowLock is a row lock's value.
	RowLock *RowLock
	// Part is a part marker's value.
	Part *AggregatePart
	// ShardMap is the shard map (the shard-map key).
	ShardMap *ShardMap
	// ShardMove is a resharding's move (its pending or switching key), and
	// ReshardJob its job record.
	ShardMove  *ShardMove
	ReshardJob *ReshardJob
}

// CapacityEntry is the capacity one row or prepared aggregate holds on a
// node lifecycle.
type CapacityEntry struct {
	// State is AllocationReserved or AllocationActive.
	State authority.AllocationState
	// Vector is the capacity held.
	Vector authority.CapacityVector
	// Aggregate says the holder is an aggregate (Entry.Fence), not a row
	// (Entry.Key).
	Aggregate bool
}

// Reservation terminal states.
const (
	ReservationCommitted = "committed"
	ReservationAborted   = "aborted"
	ReservationRejected  = string(authority.TerminalRejected)
	ReservationFailed    = string(authority.TerminalFailed)
)

// ReservationTerminal is the outcome of a finished reservation.
type ReservationTerminal struct {
	// State is ReservationCommitted, ReservationAborted, ReservationRejected
	// or ReservationFailed.
	State string
	// ExpiresAt is when the store stops serving it.
	ExpiresAt time.Time
}

// Blob is a relocation blob.
type Blob struct {
	// Data is the blob's content.
	Data []byte
	// ExpiresAt is when the store stops serving it.
	ExpiresAt time.Time
}

// Expiry returns when e expires: the expiry of a reservation terminal,
// creation terminal, relocation blob or finished aggregate record; ok is
// false for every other entry, which never expires.
func (e Entry) Expiry() (at time.Time, ok bool) {
	switch {
	case e.Reservation != nil:
		return e.Reservation.ExpiresAt, true
	case e.Terminal != nil:
		return e.Terminal.ExpiresAt, true
	case e.Blob != nil:
		return e.Blob.ExpiresAt, true
	case e.Aggregate != nil && !e.Aggregate.ExpiresAt.IsZero():
		return e.Aggregate.ExpiresAt, true
	}
	return time.Time{}, false
}

// Expired reports whether the store no longer serves e at now: it expires
// (see Expiry) and its expiry has passed (it awaits the deletion of its
// lease).
func (e Entry) Expired(now time.Time) bool {
	at, ok := e.Expiry()
	return ok && !at.After(now)
}

var errBadKey = errors.New("key does not match the layout")

// DecodeEntry decodes kv, a key-value read from etcd under namespace, with
// the codec the store writes it with. It returns an EntryUnknown entry (and
// no error) for a key the layout does not name. A key or value of a known
// kind that does not decode is an error wrapping authority.ErrCorrupt. An
// owner index entry needs no value, so a keys-only read decodes too.
func DecodeEntry(namespace string, kv *mvccpb.KeyValue) (Entry, error) {
	full := string(kv.Key)
	rest, ok := strings.CutPrefix(full, namespace)
	if !ok {
		return Entry{Kind: EntryUnknown}, nil
	}
	kind := EntryUnknown
	for k, seg := range segments {
		if strings.HasPrefix(rest, seg) {
			kind, rest = k, rest[len(seg):]
			break
		}
	}
	e := Entry{Kind: kind}
	var err error
	switch kind {
	case EntryRow:
		e.Key = authority.Key(rest)
		var r *Row
		if r, err = DecodeRow(e.Key, kv); err == nil {
			e.Snapshot = r.Snapshot(time.Time{})
		}
	case EntryOwnerLiveness:
		err = e.decodeLiveness(rest, kv)
	case EntryOwnerGeneration:
		e.Owner.OwnerID, err = url.PathUnescape(rest)
		if err == nil {
			e.Owner.LeaseGeneration, err = DecodeOwnerGeneration(kv)
		}
	case EntryOwnerIndex:
		parts := strings.SplitN(rest, "/", 3)
		if len(parts) != 3 {
			return e, corrupt(full, errBadKey)
		}
		if e.Owner, err = parseOwner(parts[0], parts[1]); err == nil {
			e.Key = authority.Key(parts[2])
		}
	case EntryCapacity:
		err = e.decodeCapacity(rest, kv)
	case EntryReservation:
		if e.ReservationID, err = url.PathUnescape(rest); err == nil {
			var rec ReservationTerminal
			if rec, err = DecodeReservation(kv); err == nil {
				e.Reservation = &rec
			}
		}
	case EntryTerminal:
		e.Terminal, err = DecodeTerminal(kv)
		if err == nil && e.Terminal.Operation.Key() != rest {
			err = fmt.Errorf("operation %q under key %q: %w", e.Terminal.Operation.Key(), rest, errBadKey)
		}
	case EntryAggregate:
		err = e.decodeAggregate(rest, kv)
	case EntryCapacityEpoch:
		err = e.decodeCapacityEpoch(rest, kv)
	case EntryOwnerNode:
		err = e.decodeOwnerNode(rest, kv.Value)
	case EntryStoreVersion:
		err = e.decodeStoreVersion(namespace, kv)
	case EntryEscrow:
		err = e.decodeEscrow(rest, kv)
	case EntryRowLock:
		e.Key = authority.Key(rest)
		var l RowLock
		if l, err = DecodeRowLock(kv); err == nil {
			e.RowLock = &l
		}
	case EntryAggregatePart:
		err = e.decodeAggregatePart(rest, kv)
	case EntryShardMap:
		err = e.decodeShardMap(namespace, kv)
	case EntryBlob:
		e.BlobReference = authority.BlobReference(rest)
		expires, data, berr := DecodeBlob(kv)
		if berr != nil {
			return e, berr
		}
		e.Blob = &Blob{ExpiresAt: expires, Data: bytes.Clone(data)}
	}
	if err != nil {
		if errors.Is(err, authority.ErrCorrupt) {
			return e, err
		}
		return e, corrupt(full, err)
	}
	return e, nil
}

// parseOwner parses the "<esc owner>/<lease gen>" segments of a key.
func parseOwner(id, gen string) (authority.OwnerToken, error) {
	ownerID, err := url.PathUnescape(id)
	if err != nil {
		return authority.OwnerToken{}, err
	}
	g, err := strconv.ParseInt(gen, 10, 64)
	if err != nil {
		return authority.OwnerToken{}, err
	}
	return authority.OwnerToken{OwnerID: ownerID, LeaseGeneration: g}, nil
}

// parseNode parses the "<esc mesh>/<esc rid>/<lifecycle>" segments of a key.
func parseNode(mesh, rid, lifecycle string) (authority.NodeDescriptor, int64, error) {
	m, err := url.PathUnescape(mesh)
	if err != nil {
		return authority.NodeDescriptor{}, 0, err
	}
	r, err := url.PathUnescape(rid)
	if err != nil {
		return authority.NodeDescriptor{}, 0, err
	}
	lc, err := strconv.ParseInt(lifecycle, 10, 64)
	if err != nil {
		return authority.NodeDescriptor{}, 0, err
	}
	return authority.NodeDescriptor{MeshName: m, RID: r}, lc, nil
}

// parseFence parses the "<esc aggregate ID>/<generation>" segments of a key.
func parseFence(id, gen string) (authority.Fence, error) {
	aid, err := url.PathUnescape(id)
	if err != nil {
		return authority.Fence{}, err
	}
	g, err := strconv.ParseInt(gen, 10, 64)
	if err != nil {
		return authority.Fence{}, err
	}
	return authority.Fence{AggregateID: aid, AggregateGeneration: g}, nil
}

// decodeLiveness decodes owners/<esc owner>/<lease gen>/<esc mesh>/<esc rid>/<lifecycle>;
// the key and the value name the same owner and node lifecycle.
func (e *Entry) decodeLiveness(rest string, kv *mvccpb.KeyValue) error {
	parts := strings.Split(rest, "/")
	if len(parts) != 5 {
		return errBadKey
	}
	var err error
	if e.Owner, err = parseOwner(parts[0], parts[1]); err != nil {
		return err
	}
	if e.Node, e.Lifecycle, err = parseNode(parts[2], parts[3], parts[4]); err != nil {
		return err
	}
	v, err := DecodeLiveness(kv.Value)
	if err != nil {
		return err
	}
	if v != (Liveness{MeshName: e.Node.MeshName, RID: e.Node.RID, Lifecycle: e.Lifecycle, OwnerID: e.Owner.OwnerID, Lease: e.Owner.LeaseGeneration}) {
		return fmt.Errorf("value names another owner or node: %w", errBadKey)
	}
	return nil
}

// decodeCapacity decodes capacity/<esc mesh>/<esc rid>/<lifecycle>/row/<authority key>,
// capacity/<esc mesh>/<esc rid>/<lifecycle>/agg/<esc id>/<gen> and a
// placement key, capacity/<esc mesh>/<esc rid>/<lifecycle>/o/<esc owner>/<lease gen>/<authority key>.
func (e *Entry) decodeCapacity(rest string, kv *mvccpb.KeyValue) error {
	parts := strings.SplitN(rest, "/", 5)
	if len(parts) != 5 {
		return errBadKey
	}
	var err error
	if e.Node, e.Lifecycle, err = parseNode(parts[0], parts[1], parts[2]); err != nil {
		return err
	}
	c := &CapacityEntry{}
	switch parts[3] {
	case capRow:
		e.Key = authority.Key(parts[4])
	case capAgg:
		id, gen, ok := strings.Cut(parts[4], "/")
		if !ok {
			return errBadKey
		}
		if e.Fence, err = parseFence(id, gen); err != nil {
			return err
		}
		c.Aggregate = true
	case capOwned:
		owned := strings.SplitN(parts[4], "/", 3)
		if len(owned) != 3 || owned[2] == "" {
			return errBadKey
		}
		if e.Owner, err = parseOwner(owned[0], owned[1]); err != nil {
			return err
		}
		e.Key = authority.Key(owned[2])
	default:
		return errBadKey
	}
	if c.State, c.Vector, err = DecodeCapacityEntry(kv.Value); err != nil {
		return err
	}
	e.Capacity = c
	return nil
}

// decodeCapacityEpoch decodes capacity-epochs/<esc mesh>/<esc rid>/<lifecycle>,
// whose value is empty.
func (e *Entry) decodeCapacityEpoch(rest string, kv *mvccpb.KeyValue) error {
	parts := strings.Split(rest, "/")
	if len(parts) != 3 {
		return errBadKey
	}
	var err error
	if e.Node, e.Lifecycle, err = parseNode(parts[0], parts[1], parts[2]); err != nil {
		return err
	}
	if len(kv.Value) != 0 {
		return errors.New("capacity epoch with a value")
	}
	return nil
}

// decodeAggregate decodes aggregates/<esc aggregate ID>/<generation>.
func (e *Entry) decodeAggregate(rest string, kv *mvccpb.KeyValue) error {
	id, gen, ok := strings.Cut(rest, "/")
	if !ok {
		return errBadKey
	}
	var err error
	if e.Fence, err = parseFence(id, gen); err != nil {
		return err
	}
	rec, err := DecodeAggregate(kv)
	if err != nil {
		return err
	}
	e.Aggregate = rec
	return nil
}

// decodeAggregatePart decodes aggregate-parts/<esc id>/<gen>.
func (e *Entry) decodeAggregatePart(rest string, kv *mvccpb.KeyValue) error {
	id, gen, ok := strings.Cut(rest, "/")
	if !ok {
		return errBadKey
	}
	var err error
	if e.Fence, err = parseFence(id, gen); err != nil {
		return err
	}
	p, err := DecodeAggregatePart(kv)
	if err != nil {
		return err
	}
	e.Part = &p
	return nil
}
