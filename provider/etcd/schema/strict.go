package schema

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"

	authority "github.com/zlink-systems/authority"
)

// maxStoredCount bounds every count a stored value holds (the contract's
// capacity bound): a larger or negative one is corrupt.
const maxStoredCount = 0x7fff_ffff

// errNotObject reports a stored JSON value that is not one object.
var errNotObject = errors.New("stored value is not one JSON object")

// decodeStrict decodes the JSON object data into v: an unknown field, a value
// of the wrong type or out of its Go type's range, `null`, anything that is
// not an object and trailing data are all errors. The caller then checks
// that the decoded fields are present and in range (checkX below).
func decodeStrict(data []byte, v any) error {
	data = bytes.TrimSpace(data)
	if len(data) == 0 || data[0] != jsonObjectStart {
		return errNotObject
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errNotObject
	}
	return nil
}

// storedText checks a stored string that must be non-empty text: the rule of
// the contract's RequireText, whose error would make a corrupt read also
// match ErrInvalidArgument.
func storedText(value, name string) error {
	if value == "" || strings.IndexByte(value, 0) >= 0 || !utf8.ValidString(value) {
		return fmt.Errorf("%s is not non-empty text", name)
	}
	return nil
}

// storedCount checks a stored count: 0 ≤ n ≤ maxStoredCount.
func storedCount(n int64, name string) error {
	if n < 0 || n > maxStoredCount {
		return fmt.Errorf("%s %d is out of range", name, n)
	}
	return nil
}

// check validates a stored capacity vector: every count in range, the Spot
// type present exactly when flagged and of a Spot kind.
func (w capacityWire) check() error {
	for _, c := range []struct {
		n    int64
		name string
	}{{w.Actors, "actor count"}, {w.Spots, "spot count"}, {w.Count, "spot type count"}} {
		if err := storedCount(c.n, c.name); err != nil {
			return err
		}
	}
	if !w.HasST {
		if w.Kind != "" || w.Type != "" || w.Count != 0 {
			return errors.New("spot type fields without a spot type")
		}
		return nil
	}
	if !authority.ObjectKind(w.Kind).IsSpot() || !utf8.ValidString(w.Type) || strings.IndexByte(w.Type, 0) >= 0 {
		return fmt.Errorf("spot type %q/%q is invalid", w.Kind, w.Type)
	}
	return nil
}

// check validates a decoded row header.
func (w *rowWire) check() error {
	if w.State != string(authority.AllocationActive) && w.State != string(authority.AllocationReserved) {
		return fmt.Errorf("row state %q", w.State)
	}
	switch authority.ObjectKind(w.Kind) {
	case authority.ObjectActor, authority.ObjectUserSpot, authority.ObjectInstanceSpot:
	default:
		return fmt.Errorf("row object kind %q", w.Kind)
	}
	for _, t := range []struct{ v, name string }{{w.OwnerID, "owner ID"}, {w.Mesh, "mesh name"}, {w.RID, "node RID"}} {
		if err := storedText(t.v, t.name); err != nil {
			return err
		}
	}
	if w.OwnerGen < 0 || w.Lease < 0 || (w.Token != nil && *w.Token < 0) || w.ObjectGen < 0 || w.MovedVersion < 0 {
		return errors.New("negative owner generation, lease generation, ownership token, object generation or version")
	}
	if p := w.Pending; p != nil {
		if err := storedText(p.ReservationID, "reservation ID"); err != nil {
			return err
		}
		if p.Size < 0 {
			return errors.New("negative request size")
		}
	}
	if w.Committed != nil && w.State != string(authority.AllocationActive) {
		return errors.New("a reserved row names the reservation that committed it")
	}
	return w.Capacity.check()
}

// check validates a decoded reservation terminal.
func (r reservationWire) check() error {
	switch r.State {
	case ReservationCommitted, ReservationAborted, string(authority.TerminalRejected), string(authority.TerminalFailed):
	default:
		return fmt.Errorf("reservation terminal state %q", r.State)
	}
	if r.ExpiresAt.IsZero() {
		return errors.New("reservation terminal without an expiry")
	}
	return nil
}

// check validates a decoded creation terminal.
func (w *terminalWire) check() error {
	switch authority.TerminalState(w.State) {
	case authority.TerminalCreated, authority.TerminalRejected, authority.TerminalFailed:
	default:
		return fmt.Errorf("creation terminal state %q", w.State)
	}
	if authority.ObjectKind(w.Kind) != authority.ObjectActor {
		return fmt.Errorf("creation terminal object kind %q", w.Kind)
	}
	if err := storedText(w.Reservation, "reservation ID"); err != nil {
		return err
	}
	if w.ExpiresAt.IsZero() {
		return errors.New("creation terminal without an expiry")
	}
	return nil
}

// check validates a decoded owner liveness value.
func (l Liveness) check() error {
	for _, t := range []struct{ v, name string }{{l.OwnerID, "owner ID"}, {l.MeshName, "mesh name"}, {l.RID, "node RID"}} {
		if err := storedText(t.v, t.name); err != nil {
			return err
		}
	}
	if l.Lease < 0 {
		return errors.New("negative lease generation")
	}
	return nil
}

// check validates a stored aggregate record (format 1).
func (w *aggregateWire) check() error {
	switch w.State {
	case AggregatePrepared, AggregateCommitted, AggregateAborted:
	default:
		return fmt.Errorf("aggregate state %q is unknown", w.State)
	}
	for _, f := range [][2]string{{w.ID, "aggregate ID"}, {w.OwnerID, "target owner"}, {w.Mesh, "target mesh"}, {w.RID, "target RID"}} {
		if err := storedText(f[0], f[1]); err != nil {
			return err
		}
	}
	if w.Generation < 1 || w.Lease < 0 || w.Lifecycle < 0 || len(w.Parts) == 0 {
		return errors.New("aggregate generation, lease, lifecycle or participants out of range")
	}
	if w.Inc != "" && !idText(w.Inc) {
		return errors.New("aggregate incarnation out of range")
	}
	for _, p := range w.Parts {
		if err := storedText(p.Key, "participant key"); err != nil {
			return err
		}
		// a version may be empty (the row absent), but is text: format 1
		// (JSON) could not hold it otherwise
		if p.Version != "" && storedText(p.Version, "participant version") != nil {
			return fmt.Errorf("participant %q version is not text", p.Key)
		}
		if p.Transition != string(authority.TransitionPreserve) && p.Transition != string(authority.TransitionNewOwner) {
			return fmt.Errorf("participant transition %q is unknown", p.Transition)
		}
	}
	return w.Capacity.check()
}
