package schema

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"go.etcd.io/etcd/api/v3/mvccpb"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/provider/etcd/schema/internal/compactpb"
	"github.com/zlink-systems/authority/provider/etcd/storeversion"
)

// The values of storeversion.FewerKeys: the row's placement flag and the
// reservation that committed it (fields of the compact row), and the
// compact creation terminal.

// FewerKeysAt reports whether a namespace at active version v writes the
// forms of storeversion.FewerKeys (placement keys, no reservation terminal
// at a commit, compact creation terminals).
func FewerKeysAt(v storeversion.Version) bool { return v >= storeversion.FewerKeys }

// CommittedReservation is the reservation whose commit made an active row,
// kept in the row (storeversion.FewerKeys) instead of a reservation
// terminal: until Until, a retry of that commit finds it here and is
// answered alreadyCommitted.
type CommittedReservation struct {
	// ID is the reservation.
	ID string
	// Until is when the answer ends: the commit's time plus the store's
	// reservation retention.
	Until time.Time
}

// fewerKeys reports whether r carries a field of storeversion.FewerKeys.
// Such a row exists only once its namespace was finalized there, so writing
// it again keeps them (EncodeAt), whatever version the writer last learned.
func (r *Row) fewerKeys() bool { return r.PlacementKey || r.Committed != nil }

// packID stores a reservation ID: a canonical UUID (what the store's
// reservations are) as its 16 bytes, any other text as itself.
func packID(id string) (packed, text []byte) {
	if u, err := uuid.Parse(id); err == nil && u.String() == id {
		return u[:], nil
	}
	return nil, []byte(id)
}

var errBadID = errors.New("reservation ID is neither one 16-byte UUID nor text")

// unpackID reads a reservation ID stored by packID.
func unpackID(packed, text []byte) (string, error) {
	switch {
	case len(packed) == 16 && len(text) == 0:
		return uuid.UUID(packed).String(), nil
	case len(packed) == 0:
		id := string(text)
		return id, storedText(id, "reservation ID")
	}
	return "", errBadID
}

// packTime stores t as Unix seconds and nanoseconds.
func packTime(t time.Time) (int64, int32) { return t.Unix(), int32(t.Nanosecond()) }

// unpackTime reads a time stored by packTime; 0, 0 (no time) and
// nanoseconds out of range are errors.
func unpackTime(sec int64, nsec int32, name string) (time.Time, error) {
	if sec == 0 && nsec == 0 || nsec < 0 || nsec >= 1e9 {
		return time.Time{}, fmt.Errorf("%s is missing or out of range", name)
	}
	return time.Unix(sec, int64(nsec)).UTC(), nil
}

func committedToCompact(c *CommittedReservation) *compactpb.Committed {
	if c == nil {
		return nil
	}
	m := &compactpb.Committed{}
	m.ReservationUuid, m.ReservationId = packID(c.ID)
	m.UntilSeconds, m.UntilNanos = packTime(c.Until)
	return m
}

func committedFromCompact(m *compactpb.Committed) (*CommittedReservation, error) {
	if m == nil {
		return nil, nil
	}
	id, err := unpackID(m.ReservationUuid, m.ReservationId)
	if err != nil {
		return nil, err
	}
	until, err := unpackTime(m.UntilSeconds, m.UntilNanos, "committed reservation's end")
	if err != nil {
		return nil, err
	}
	return &CommittedReservation{ID: id, Until: until}, nil
}

var terminalStates = []struct {
	c compactpb.TerminalState
	s authority.TerminalState
}{{compactpb.TerminalState_CREATED, authority.TerminalCreated}, {compactpb.TerminalState_REJECTED, authority.TerminalRejected},
	{compactpb.TerminalState_FAILED, authority.TerminalFailed}}

// EncodeTerminalAt returns the stored value of a creation terminal in the
// format of active version v: from storeversion.FewerKeys on, the marker
// 00 02 and a compactpb.CreationTerminal, which keeps neither the operation
// (the key names it) nor the envelope's digest (computed from the envelope:
// a completion's digest must match it).
func EncodeTerminalAt(v storeversion.Version, t *authority.TerminalRecord) string {
	if !FewerKeysAt(v) {
		return EncodeTerminal(t)
	}
	m := &compactpb.CreationTerminal{Kind: kindToCompact(t.ObjectKind), Envelope: t.TerminalEnvelope}
	for _, e := range terminalStates {
		if e.s == t.State {
			m.State = e.c
		}
	}
	m.ReservationUuid, m.ReservationId = packID(t.ReservationID)
	m.ExpiresSeconds, m.ExpiresNanos = packTime(t.ExpiresAt)
	m.NowSeconds, m.NowNanos = packTime(t.StoreNow)
	return compactMarker + string(marshalCompact(m))
}

// decodeTerminalCompact decodes a compact creation terminal (after its
// marker) stored at key.
func decodeTerminalCompact(key string, v []byte) (*authority.TerminalRecord, error) {
	var m compactpb.CreationTerminal
	if err := unmarshalCompact(v, &m); err != nil {
		return nil, err
	}
	op, err := operationFromKey(key)
	if err != nil {
		return nil, err
	}
	t := &authority.TerminalRecord{Operation: op, ObjectKind: authority.ObjectKind(kindFromCompact(m.Kind))}
	for _, e := range terminalStates {
		if e.c == m.State {
			t.State = e.s
		}
	}
	if t.State == "" {
		return nil, fmt.Errorf("creation terminal state %d", int32(m.State))
	}
	if t.ObjectKind != authority.ObjectActor {
		return nil, fmt.Errorf("creation terminal object kind %q", t.ObjectKind)
	}
	if t.ReservationID, err = unpackID(m.ReservationUuid, m.ReservationId); err != nil {
		return nil, err
	}
	if t.ExpiresAt, err = unpackTime(m.ExpiresSeconds, m.ExpiresNanos, "creation terminal expiry"); err != nil {
		return nil, err
	}
	if t.StoreNow, err = unpackTime(m.NowSeconds, m.NowNanos, "creation terminal's store time"); err != nil {
		return nil, err
	}
	t.TerminalEnvelope = m.Envelope
	if t.TerminalEnvelope == nil {
		t.TerminalEnvelope = []byte{}
	}
	sum := sha256.Sum256(t.TerminalEnvelope)
	t.TerminalEnvelopeSHA256 = sum[:]
	return t, nil
}

// operationFromKey returns the creation operation a creation terminal's key
// names: its last three path segments, as CreationOperation.Key writes
// them (<esc source RID>/<source generation>/<32 hex digits>).
func operationFromKey(key string) (authority.CreationOperation, error) {
	parts := strings.Split(key, "/")
	if len(parts) < 3 {
		return authority.CreationOperation{}, errBadKey
	}
	rid, gen, id := parts[len(parts)-3], parts[len(parts)-2], parts[len(parts)-1]
	var op authority.CreationOperation
	var err error
	if op.SourceNodeRID, err = url.PathUnescape(rid); err != nil {
		return op, errBadKey
	}
	if op.SourceNodeGeneration, err = strconv.ParseInt(gen, 10, 64); err != nil || len(id) != 32 {
		return op, errBadKey
	}
	if op.OperationID.High, err = strconv.ParseUint(id[:16], 16, 64); err != nil {
		return op, errBadKey
	}
	if op.OperationID.Low, err = strconv.ParseUint(id[16:], 16, 64); err != nil {
		return op, errBadKey
	}
	if op.Key() != rid+"/"+gen+"/"+id {
		return op, errBadKey
	}
	return op, storedText(op.SourceNodeRID, "creation operation source RID")
}

// decodeTerminalAny decodes a creation terminal of either format.
func decodeTerminalAny(kv *mvccpb.KeyValue) (*authority.TerminalRecord, error) {
	if rest, ok := strings.CutPrefix(string(kv.Value), compactMarker); ok {
		return decodeTerminalCompact(string(kv.Key), []byte(rest))
	}
	var w terminalWire
	if err := decodeStrict(kv.Value, &w); err != nil {
		return nil, err
	}
	if err := w.check(); err != nil {
		return nil, err
	}
	return &authority.TerminalRecord{
		State: authority.TerminalState(w.State), Operation: w.Operation.operation(), ReservationID: w.Reservation,
		ObjectKind: authority.ObjectKind(w.Kind), TerminalEnvelope: w.Envelope, TerminalEnvelopeSHA256: w.EnvelopeSHA,
		ExpiresAt: w.ExpiresAt, StoreNow: w.StoreNow,
	}, nil
}
