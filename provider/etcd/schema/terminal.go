package schema

import (
	"encoding/json"
	"time"

	authority "github.com/zlink-systems/authority"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

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

// terminalWire is the stored value of a creation terminal.
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

// DecodeTerminal decodes a creation terminal strictly, of either format
// (format 1, JSON, or the compact one of storeversion.FewerKeys, whose
// operation is read from kv's key).
func DecodeTerminal(kv *mvccpb.KeyValue) (*authority.TerminalRecord, error) {
	t, err := decodeTerminalAny(kv)
	if err != nil {
		return nil, corrupt(string(kv.Key), err)
	}
	return t, nil
}
