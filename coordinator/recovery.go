package coordinator

import (
	"time"

	authority "github.com/zlink-systems/authority"
)

// ActivationTarget names the Instance Spot an activation places and the node
// it is activated on.
type ActivationTarget struct {
	TargetSpotID         string
	StableType           string
	TargetNodeRID        string
	TargetNodeGeneration int64
}

// Activation is an Instance activation request: a recovery envelope
// without its mesh name, which the authority adds.
type Activation struct {
	Target ActivationTarget
	// Deadline bounds the activation, including any wait for a concurrent
	// activation or close.
	Deadline time.Time
	// Request is the application's activation request, opaque here.
	Request []byte
}

// RecoveryEnvelope is what an activation stores as its relocation blob, so
// that a restarted node can resume it.
type RecoveryEnvelope struct {
	TargetMeshName string
	Activation
}

// Wire format (version 1), integers big-endian, strings and bytes as a u32
// length and the bytes: "ZR" 0x01 | targetMeshName | targetSpotID |
// stableType | targetNodeRID | targetNodeGeneration i64 | deadline unix ms
// i64 | request bytes. Nothing may follow.
const (
	envelopeMagic0  = 'Z'
	envelopeMagic1  = 'R'
	envelopeVersion = 1
)

func validateEnvelope(e *RecoveryEnvelope) string {
	t := e.Target
	for _, s := range []string{e.TargetMeshName, t.TargetSpotID, t.StableType, t.TargetNodeRID} {
		if !validText(s) {
			return "Instance activation text fields must be non-empty UTF-8 without NUL."
		}
	}
	if t.TargetNodeGeneration < 0 || e.Deadline.IsZero() {
		return "Instance activation node generation and deadline are invalid."
	}
	return ""
}

// EncodeRecoveryEnvelope returns the canonical encoding of e. The deadline is
// kept to the millisecond.
func EncodeRecoveryEnvelope(e RecoveryEnvelope) ([]byte, error) {
	if msg := validateEnvelope(&e); msg != "" {
		return nil, authority.Invalid(msg)
	}
	var w writer
	w.b = append(w.b, envelopeMagic0, envelopeMagic1, envelopeVersion)
	w.str(e.TargetMeshName)
	w.str(e.Target.TargetSpotID)
	w.str(e.Target.StableType)
	w.str(e.Target.TargetNodeRID)
	w.i64(e.Target.TargetNodeGeneration)
	w.i64(e.Deadline.UnixMilli())
	w.blob(e.Request)
	return w.b, nil
}

// DecodeRecoveryEnvelope decodes an encoding made by EncodeRecoveryEnvelope,
// rejecting anything else with an error wrapping ErrMalformed.
func DecodeRecoveryEnvelope(b []byte) (RecoveryEnvelope, error) {
	if len(b) < 3 || b[0] != envelopeMagic0 || b[1] != envelopeMagic1 || b[2] != envelopeVersion {
		return RecoveryEnvelope{}, malformed("Instance activation recovery envelope header is invalid.")
	}
	r := reader{b: b, off: 3}
	var e RecoveryEnvelope
	e.TargetMeshName = r.str()
	e.Target.TargetSpotID = r.str()
	e.Target.StableType = r.str()
	e.Target.TargetNodeRID = r.str()
	e.Target.TargetNodeGeneration = r.i64()
	e.Deadline = time.UnixMilli(r.i64())
	e.Request = r.blob()
	if r.bad {
		return RecoveryEnvelope{}, malformed("Instance activation recovery envelope is truncated.")
	}
	if r.off != len(b) {
		return RecoveryEnvelope{}, malformed("Instance activation recovery envelope has trailing bytes.")
	}
	if msg := validateEnvelope(&e); msg != "" {
		return RecoveryEnvelope{}, malformed(msg)
	}
	if e.Request == nil {
		e.Request = []byte{}
	}
	return e, nil
}
