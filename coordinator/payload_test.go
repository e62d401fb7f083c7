package coordinator_test

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"strings"
	"testing"
	"time"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/coordinator"
)

func samplePayload(kind authority.ObjectKind, state coordinator.State) coordinator.Payload {
	return coordinator.Payload{
		Kind: kind, State: state, StableType: "chat.Room", SpotID: "room-7",
		OwnerID: "owner-a", OwnerLeaseGeneration: 3, OwnerMeshName: "mesh",
		OwnerNodeRID: "node-a", OwnerNodeGeneration: 9,
	}
}

func sampleRecovery() *coordinator.ActivationRecovery {
	sum := sha256.Sum256([]byte("envelope"))
	return &coordinator.ActivationRecovery{Reference: "blob-1", SHA256: sum[:], EncodedSize: 8, InboxSequence: 1, ReplayCursor: 0}
}

func validPayloads() []coordinator.Payload {
	var out []coordinator.Payload
	for _, s := range []coordinator.State{coordinator.StateCreating, coordinator.StateReady, coordinator.StateClosing} {
		out = append(out, samplePayload(authority.ObjectUserSpot, s))
	}
	for _, s := range []coordinator.State{coordinator.StateColdActivating, coordinator.StateReady, coordinator.StateClosing} {
		out = append(out, samplePayload(authority.ObjectInstanceSpot, s))
		p := samplePayload(authority.ObjectInstanceSpot, s)
		p.ActivationRecovery = sampleRecovery()
		out = append(out, p)
	}
	return out
}

func TestPayloadRoundTrip(t *testing.T) {
	for _, p := range validPayloads() {
		b, err := coordinator.EncodePayload(p)
		if err != nil {
			t.Fatalf("encode %+v: %v", p, err)
		}
		got, err := coordinator.DecodePayload(b)
		if err != nil {
			t.Fatalf("decode %+v: %v", p, err)
		}
		again, _ := coordinator.EncodePayload(got)
		if !bytes.Equal(again, b) || got.Kind != p.Kind || got.State != p.State || got.SpotID != p.SpotID ||
			got.OwnerLeaseGeneration != p.OwnerLeaseGeneration || (got.ActivationRecovery == nil) != (p.ActivationRecovery == nil) {
			t.Fatalf("round trip changed %+v into %+v", p, got)
		}
		if r := got.ActivationRecovery; r != nil && (r.Reference != "blob-1" || r.InboxSequence != 1 || !bytes.Equal(r.SHA256, p.ActivationRecovery.SHA256)) {
			t.Fatalf("recovery changed: %+v", r)
		}
		ready, ok := coordinator.DecodeReadySpot(b)
		if ok != (p.State == coordinator.StateReady) || ok && ready.Kind != p.Kind {
			t.Fatalf("DecodeReadySpot(%s) = %v", p.State, ok)
		}
		_, err = coordinator.DecodeInstancePayload(b)
		if (err == nil) != (p.Kind == authority.ObjectInstanceSpot) {
			t.Fatalf("DecodeInstancePayload(%s) err = %v", p.Kind, err)
		}
	}
	u, err := coordinator.EncodeUserSpotPayload(coordinator.Payload{State: coordinator.StateReady, StableType: "t", SpotID: "s", OwnerID: "o", OwnerMeshName: "m", OwnerNodeRID: "n"})
	if err != nil {
		t.Fatal(err)
	}
	if p, _ := coordinator.DecodePayload(u); p.Kind != authority.ObjectUserSpot {
		t.Fatalf("EncodeUserSpotPayload kind = %s", p.Kind)
	}
}

func TestEncodePayloadRejectsInvalid(t *testing.T) {
	mut := map[string]func(p *coordinator.Payload){
		"kind":              func(p *coordinator.Payload) { p.Kind = authority.ObjectActor },
		"user coldActivate": func(p *coordinator.Payload) { p.State = coordinator.StateColdActivating },
		"user recovery":     func(p *coordinator.Payload) { p.ActivationRecovery = sampleRecovery() },
		"empty state":       func(p *coordinator.Payload) { p.State = "" },
		"empty spot":        func(p *coordinator.Payload) { p.SpotID = "" },
		"NUL owner":         func(p *coordinator.Payload) { p.OwnerID = "a\x00b" },
		"bad UTF-8":         func(p *coordinator.Payload) { p.StableType = "\xff" },
		"negative lease":    func(p *coordinator.Payload) { p.OwnerLeaseGeneration = -1 },
		"negative node":     func(p *coordinator.Payload) { p.OwnerNodeGeneration = -1 },
		"huge":              func(p *coordinator.Payload) { p.SpotID = strings.Repeat("x", authority.MaxPayloadBytes) },
	}
	recMut := map[string]func(r *coordinator.ActivationRecovery){
		"short sha":     func(r *coordinator.ActivationRecovery) { r.SHA256 = r.SHA256[:31] },
		"empty ref":     func(r *coordinator.ActivationRecovery) { r.Reference = "" },
		"cursor ahead":  func(r *coordinator.ActivationRecovery) { r.ReplayCursor = 2 },
		"negative size": func(r *coordinator.ActivationRecovery) { r.EncodedSize = -1 },
		"huge size":     func(r *coordinator.ActivationRecovery) { r.EncodedSize = authority.MaxPayloadBytes + 1 },
		"negative seq":  func(r *coordinator.ActivationRecovery) { r.InboxSequence = -1 },
	}
	for name, m := range mut {
		p := samplePayload(authority.ObjectUserSpot, coordinator.StateReady)
		m(&p)
		if _, err := coordinator.EncodePayload(p); !errors.Is(err, authority.ErrInvalidArgument) {
			t.Errorf("%s: err = %v, want ErrInvalidArgument", name, err)
		}
	}
	for name, m := range recMut {
		p := samplePayload(authority.ObjectInstanceSpot, coordinator.StateReady)
		p.ActivationRecovery = sampleRecovery()
		m(p.ActivationRecovery)
		if _, err := coordinator.EncodePayload(p); !errors.Is(err, authority.ErrInvalidArgument) {
			t.Errorf("%s: err = %v, want ErrInvalidArgument", name, err)
		}
	}
}

func TestDecodePayloadRejectsMalformed(t *testing.T) {
	p := samplePayload(authority.ObjectInstanceSpot, coordinator.StateReady)
	p.ActivationRecovery = sampleRecovery()
	good, err := coordinator.EncodePayload(p)
	if err != nil {
		t.Fatal(err)
	}
	reject := func(name string, b []byte) {
		t.Helper()
		if _, err := coordinator.DecodePayload(b); !errors.Is(err, coordinator.ErrMalformed) {
			t.Errorf("%s: err = %v, want ErrMalformed", name, err)
		}
	}
	for n := 0; n < len(good); n++ {
		reject("truncated", good[:n])
	}
	reject("trailing", append(bytes.Clone(good), 0))
	set := func(i int, v byte) []byte { b := bytes.Clone(good); b[i] = v; return b }
	reject("magic", set(0, 'X'))
	reject("version", set(2, 2))
	reject("kind", set(3, 9))
	reject("state", set(4, 9))
	reject("instance creating", set(4, 1))
	user, _ := coordinator.EncodePayload(samplePayload(authority.ObjectUserSpot, coordinator.StateReady))
	flagged := bytes.Clone(user)
	flagged[len(flagged)-1] = 2
	reject("flag", flagged)
	recovered := append(bytes.Clone(user[:len(user)-1]), good[len(good)-(1+4+6+32+24):]...)
	reject("user spot with recovery", recovered)
	// A string length pointing past the end.
	reject("length", set(8, 0xff))
	// A NUL inside a string.
	b := bytes.Clone(good)
	b[9] = 0
	reject("NUL", b)
}

func TestContentReference(t *testing.T) {
	for _, payload := range [][]byte{{}, []byte("a"), []byte("hello world"), bytes.Repeat([]byte{0xff, 0, 7}, 100)} {
		ref := coordinator.EncodeContentReference(payload)
		if !strings.HasPrefix(ref, coordinator.ContentReferencePrefix) {
			t.Fatalf("ref %q", ref)
		}
		sum := sha256.Sum256(payload)
		got, err := coordinator.DecodeContentReference(ref, coordinator.ContentCheck{SHA256: sum[:], EncodedSize: int64(len(payload))})
		if err != nil || !bytes.Equal(got, payload) {
			t.Fatalf("decode %q = %q, %v", ref, got, err)
		}
	}
	// The seed's vector: crc32c("123456789") = e3069283.
	if got := coordinator.CRC32C([]byte("123456789")); got != 0xe3069283 {
		t.Fatalf("crc32c = %08x", got)
	}
	if ref := coordinator.EncodeContentReference([]byte("123456789")); ref != "inline-v1:e3069283:MTIzNDU2Nzg5" {
		t.Fatalf("ref = %q", ref)
	}
	good := coordinator.EncodeContentReference([]byte("hi"))
	for _, ref := range []string{
		"", "inline-v2:00000000:aGk", "inline-v1:", "inline-v1:0000000:aGk", "inline-v1:0000000G:aGk",
		strings.Replace(good, "inline-v1:", "inline-v1:", 1)[:len(good)-1] + "=",
		strings.ToUpper(good[:19]) + good[19:],
		good + "\n", good[:20] + "\n" + good[20:], good + "+", good + "/",
		"inline-v1:00000000:aGl", // non-canonical trailing bits
		"inline-v1:00000000;aGk",
	} {
		if _, err := coordinator.DecodeContentReference(ref, coordinator.NoContentCheck); !errors.Is(err, coordinator.ErrMalformed) {
			t.Errorf("%q: err = %v, want ErrMalformed", ref, err)
		}
	}
	integrity := func(name, ref string, check coordinator.ContentCheck) {
		t.Helper()
		if _, err := coordinator.DecodeContentReference(ref, check); !errors.Is(err, coordinator.KindIntegrity) {
			t.Errorf("%s: err = %v, want KindIntegrity", name, err)
		}
	}
	integrity("checksum", "inline-v1:00000000:aGk", coordinator.NoContentCheck)
	integrity("size", good, coordinator.ContentCheck{EncodedSize: 3})
	wrong := sha256.Sum256([]byte("other"))
	integrity("sha", good, coordinator.ContentCheck{SHA256: wrong[:], EncodedSize: -1})
}

func TestRecoveryEnvelope(t *testing.T) {
	e := coordinator.RecoveryEnvelope{TargetMeshName: "mesh", Activation: coordinator.Activation{
		Target:   coordinator.ActivationTarget{TargetSpotID: "i-1", StableType: "svc.Instance", TargetNodeRID: "node-a", TargetNodeGeneration: 2},
		Deadline: time.UnixMilli(1_700_000_000_123), Request: []byte("req"),
	}}
	b, err := coordinator.EncodeRecoveryEnvelope(e)
	if err != nil {
		t.Fatal(err)
	}
	got, err := coordinator.DecodeRecoveryEnvelope(b)
	if err != nil || got.TargetMeshName != "mesh" || got.Target != e.Target || !got.Deadline.Equal(e.Deadline) || string(got.Request) != "req" {
		t.Fatalf("round trip = %+v, %v", got, err)
	}
	for n := 0; n < len(b); n++ {
		if _, err := coordinator.DecodeRecoveryEnvelope(b[:n]); !errors.Is(err, coordinator.ErrMalformed) {
			t.Fatalf("truncated at %d: %v", n, err)
		}
	}
	if _, err := coordinator.DecodeRecoveryEnvelope(append(bytes.Clone(b), 1)); !errors.Is(err, coordinator.ErrMalformed) {
		t.Fatalf("trailing: %v", err)
	}
	bad := e
	bad.TargetMeshName = ""
	if _, err := coordinator.EncodeRecoveryEnvelope(bad); !errors.Is(err, authority.ErrInvalidArgument) {
		t.Fatalf("empty mesh: %v", err)
	}
	bad = e
	bad.Deadline = time.Time{}
	if _, err := coordinator.EncodeRecoveryEnvelope(bad); !errors.Is(err, authority.ErrInvalidArgument) {
		t.Fatalf("zero deadline: %v", err)
	}
	empty := e
	empty.Request = nil
	b, _ = coordinator.EncodeRecoveryEnvelope(empty)
	if got, err := coordinator.DecodeRecoveryEnvelope(b); err != nil || got.Request == nil || len(got.Request) != 0 {
		t.Fatalf("empty request = %v, %v", got.Request, err)
	}
}

func TestErrors(t *testing.T) {
	e := &coordinator.Error{Kind: coordinator.KindSpotMoving, Message: "m", Retryable: true, Cause: errors.New("cause")}
	var err error = e
	if !errors.Is(err, coordinator.KindSpotMoving) || errors.Is(err, coordinator.KindRequestFailed) {
		t.Fatal("kind matching")
	}
	if !coordinator.IsRetryable(err) || coordinator.IsRetryable(errors.New("x")) {
		t.Fatal("retryable")
	}
	if got := err.Error(); got != "SpotMoving: m: cause" {
		t.Fatalf("Error() = %q", got)
	}
	r := &coordinator.RollbackError{Err: e, Cleanup: []error{errors.New("abort failed")}}
	var got *coordinator.Error
	if !errors.As(r, &got) || got != e || !strings.Contains(r.Error(), "abort failed") {
		t.Fatalf("rollback error: %v", r)
	}
}
