package coordinator

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"strings"
	"unicode/utf8"

	authority "github.com/zlink-systems/authority"
)

// ErrMalformed reports bytes that are not a canonical coordinator encoding
// (payload, content reference or recovery envelope). Decoders return errors
// wrapping it.
var ErrMalformed = errors.New("coordinator: malformed encoding")

// State is the Framework lifecycle state a service authority payload records.
type State string

// Payload states. User Spots use creating, ready and closing; Instance Spots
// use coldActivating, ready and closing.
const (
	StateCreating       State = "creating"
	StateColdActivating State = "coldActivating"
	StateReady          State = "ready"
	StateClosing        State = "closing"
)

// ActivationRecovery is the recovery record of an Instance activation: where
// its recovery envelope is stored and how far its inbox has been replayed.
type ActivationRecovery struct {
	// Reference is the relocation blob holding the recovery envelope.
	Reference string
	// SHA256 is the envelope's SHA-256 (32 bytes).
	SHA256 []byte
	// EncodedSize is the envelope's size in bytes (0..1 MiB).
	EncodedSize int64
	// InboxSequence is the last inbox sequence the activation holds (≥ 0).
	InboxSequence int64
	// ReplayCursor is the durable replay position (0..InboxSequence).
	ReplayCursor int64
}

// Payload is a decoded service authority payload: the payload the
// coordinators write into User Spot and Instance Spot authority rows.
type Payload struct {
	// Kind is authority.ObjectUserSpot or authority.ObjectInstanceSpot.
	Kind                 authority.ObjectKind
	State                State
	StableType           string
	SpotID               string
	OwnerID              string
	OwnerLeaseGeneration int64
	OwnerMeshName        string
	OwnerNodeRID         string
	OwnerNodeGeneration  int64
	// ActivationRecovery is optional and only valid for Instance payloads.
	ActivationRecovery *ActivationRecovery
}

// Wire format (version 1), every integer big-endian:
//
//	"ZA" 0x01 | kind u8 (1 user_spot, 2 instance_spot) | state u8
//	(1 creating, 2 coldActivating, 3 ready, 4 closing) | stableType | spotID |
//	ownerID | ownerLeaseGeneration i64 | ownerMeshName | ownerNodeRID |
//	ownerNodeGeneration i64 | recovery flag u8 (0 absent, 1 present)
//	[| reference | sha256 [32] | encodedSize i64 | inboxSequence i64 |
//	replayCursor i64]
//
// where each string is a u32 length and that many bytes of UTF-8 without NUL.
// Nothing may follow. Every field has one encoding, so a payload has exactly
// one byte form and DecodePayload accepts only what EncodePayload produces.
const (
	payloadMagic0  = 'Z'
	payloadMagic1  = 'A'
	payloadVersion = 1
)

var (
	kindCodes  = map[authority.ObjectKind]byte{authority.ObjectUserSpot: 1, authority.ObjectInstanceSpot: 2}
	stateCodes = map[State]byte{StateCreating: 1, StateColdActivating: 2, StateReady: 3, StateClosing: 4}
)

func codeKind(c byte) authority.ObjectKind {
	for k, v := range kindCodes {
		if v == c {
			return k
		}
	}
	return ""
}

func codeState(c byte) State {
	for s, v := range stateCodes {
		if v == c {
			return s
		}
	}
	return ""
}

// validatePayload checks every rule the encoding promises.
func validatePayload(p *Payload) string {
	switch p.Kind {
	case authority.ObjectUserSpot:
		if p.State != StateCreating && p.State != StateReady && p.State != StateClosing {
			return "User Spot payload state must be creating, ready or closing."
		}
		if p.ActivationRecovery != nil {
			return "User Spot payload cannot carry activation recovery."
		}
	case authority.ObjectInstanceSpot:
		if p.State != StateColdActivating && p.State != StateReady && p.State != StateClosing {
			return "Instance payload state must be coldActivating, ready or closing."
		}
	default:
		return "Service authority payload kind must be user_spot or instance_spot."
	}
	for _, s := range []string{p.StableType, p.SpotID, p.OwnerID, p.OwnerMeshName, p.OwnerNodeRID} {
		if !validText(s) {
			return "Service authority payload text fields must be non-empty UTF-8 without NUL."
		}
	}
	if p.OwnerLeaseGeneration < 0 || p.OwnerNodeGeneration < 0 {
		return "Service authority payload generations must not be negative."
	}
	if r := p.ActivationRecovery; r != nil {
		if !validText(r.Reference) || len(r.SHA256) != sha256.Size ||
			r.EncodedSize < 0 || r.EncodedSize > authority.MaxPayloadBytes ||
			r.InboxSequence < 0 || r.ReplayCursor < 0 || r.ReplayCursor > r.InboxSequence {
			return "Instance activation recovery is invalid."
		}
	}
	return ""
}

func validText(s string) bool {
	return s != "" && strings.IndexByte(s, 0) < 0 && utf8.ValidString(s)
}

// EncodePayload returns the canonical encoding of p. Invalid payloads are
// rejected with an error wrapping authority.ErrInvalidArgument.
func EncodePayload(p Payload) ([]byte, error) {
	if msg := validatePayload(&p); msg != "" {
		return nil, authority.Invalid(msg)
	}
	var w writer
	w.b = append(w.b, payloadMagic0, payloadMagic1, payloadVersion, kindCodes[p.Kind], stateCodes[p.State])
	w.str(p.StableType)
	w.str(p.SpotID)
	w.str(p.OwnerID)
	w.i64(p.OwnerLeaseGeneration)
	w.str(p.OwnerMeshName)
	w.str(p.OwnerNodeRID)
	w.i64(p.OwnerNodeGeneration)
	if r := p.ActivationRecovery; r != nil {
		w.b = append(w.b, 1)
		w.str(r.Reference)
		w.b = append(w.b, r.SHA256...)
		w.i64(r.EncodedSize)
		w.i64(r.InboxSequence)
		w.i64(r.ReplayCursor)
	} else {
		w.b = append(w.b, 0)
	}
	if len(w.b) > authority.MaxPayloadBytes {
		return nil, authority.Invalid("Authority payload exceeds 1 MiB.")
	}
	return w.b, nil
}

// DecodePayload decodes any service authority payload; Kind tells which
// object it describes. Anything EncodePayload would not produce (wrong magic
// or version, unknown kind or state, truncated or trailing bytes, invalid
// fields) is rejected with an error wrapping ErrMalformed.
func DecodePayload(b []byte) (Payload, error) {
	r := reader{b: b}
	if len(b) < 5 || b[0] != payloadMagic0 || b[1] != payloadMagic1 {
		return Payload{}, malformed("Service authority payload has no payload header.")
	}
	if b[2] != payloadVersion {
		return Payload{}, malformed("Service authority payload version is unsupported.")
	}
	p := Payload{Kind: codeKind(b[3]), State: codeState(b[4])}
	r.off = 5
	p.StableType = r.str()
	p.SpotID = r.str()
	p.OwnerID = r.str()
	p.OwnerLeaseGeneration = r.i64()
	p.OwnerMeshName = r.str()
	p.OwnerNodeRID = r.str()
	p.OwnerNodeGeneration = r.i64()
	switch r.u8() {
	case 0:
	case 1:
		rec := &ActivationRecovery{Reference: r.str(), SHA256: r.bytes(sha256.Size)}
		rec.EncodedSize = r.i64()
		rec.InboxSequence = r.i64()
		rec.ReplayCursor = r.i64()
		p.ActivationRecovery = rec
	default:
		return Payload{}, malformed("Service authority payload recovery flag is invalid.")
	}
	if r.bad {
		return Payload{}, malformed("Service authority payload is truncated.")
	}
	if r.off != len(b) {
		return Payload{}, malformed("Service authority payload has trailing bytes.")
	}
	if msg := validatePayload(&p); msg != "" {
		return Payload{}, malformed(msg)
	}
	return p, nil
}

// EncodeUserSpotPayload encodes a User Spot payload; p.Kind is set for the
// caller.
func EncodeUserSpotPayload(p Payload) ([]byte, error) {
	p.Kind = authority.ObjectUserSpot
	return EncodePayload(p)
}

// EncodeInstancePayload encodes an Instance Spot payload; p.Kind is set for
// the caller.
func EncodeInstancePayload(p Payload) ([]byte, error) {
	p.Kind = authority.ObjectInstanceSpot
	return EncodePayload(p)
}

// DecodeInstancePayload decodes an Instance Spot payload in any state.
func DecodeInstancePayload(b []byte) (Payload, error) {
	p, err := DecodePayload(b)
	if err == nil && p.Kind != authority.ObjectInstanceSpot {
		return Payload{}, malformed("Service authority payload is not an Instance payload.")
	}
	return p, err
}

// DecodeReadySpot decodes a payload in the ready state, of either Spot kind.
// ok is false for anything else.
func DecodeReadySpot(b []byte) (p Payload, ok bool) {
	p, err := DecodePayload(b)
	if err != nil || p.State != StateReady {
		return Payload{}, false
	}
	return p, true
}

func malformed(msg string) error {
	return &authority.Error{Sentinel: ErrMalformed, Message: msg}
}

type writer struct{ b []byte }

func (w *writer) i64(v int64) { w.b = binary.BigEndian.AppendUint64(w.b, uint64(v)) }

func (w *writer) str(s string) {
	w.b = binary.BigEndian.AppendUint32(w.b, uint32(len(s)))
	w.b = append(w.b, s...)
}

func (w *writer) blob(b []byte) {
	w.b = binary.BigEndian.AppendUint32(w.b, uint32(len(b)))
	w.b = append(w.b, b...)
}

// reader decodes fields; after the first short read it stays bad and returns
// zero values.
type reader struct {
	b   []byte
	off int
	bad bool
}

func (r *reader) bytes(n int) []byte {
	if r.bad || n < 0 || len(r.b)-r.off < n {
		r.bad = true
		return nil
	}
	v := bytes.Clone(r.b[r.off : r.off+n])
	r.off += n
	return v
}

func (r *reader) u8() byte {
	v := r.bytes(1)
	if v == nil {
		return 0xff
	}
	return v[0]
}

func (r *reader) i64() int64 {
	v := r.bytes(8)
	if v == nil {
		return 0
	}
	return int64(binary.BigEndian.Uint64(v))
}

func (r *reader) u32() int {
	v := r.bytes(4)
	if v == nil {
		return 0
	}
	return int(binary.BigEndian.Uint32(v))
}

func (r *reader) blob() []byte {
	n := r.u32()
	if r.bad || n > len(r.b)-r.off {
		r.bad = true
		return nil
	}
	return r.bytes(n)
}

func (r *reader) str() string { return string(r.blob()) }
