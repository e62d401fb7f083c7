package coordinator_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/zlink-systems/authority/coordinator"
)

// FuzzDecodePayload checks that the payload decoder never panics and accepts
// only canonical encodings: whatever it accepts re-encodes to the same bytes.
func FuzzDecodePayload(f *testing.F) {
	for _, p := range validPayloads() {
		b, err := coordinator.EncodePayload(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := coordinator.DecodePayload(b)
		if err != nil {
			return
		}
		again, err := coordinator.EncodePayload(p)
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("accepted non-canonical payload %x (re-encoded %x, %v)", b, again, err)
		}
	})
}

// FuzzDecodeContentReference checks that the content reference decoder never
// panics and accepts only what EncodeContentReference produces.
func FuzzDecodeContentReference(f *testing.F) {
	for _, s := range []string{"", "a", "hello world", "\x00\xff"} {
		f.Add(coordinator.EncodeContentReference([]byte(s)))
	}
	f.Add("inline-v1:00000000:aGk")
	f.Fuzz(func(t *testing.T, ref string) {
		payload, err := coordinator.DecodeContentReference(ref, coordinator.NoContentCheck)
		if err != nil {
			return
		}
		if again := coordinator.EncodeContentReference(payload); again != ref {
			t.Fatalf("accepted non-canonical reference %q (re-encoded %q)", ref, again)
		}
	})
}

// FuzzDecodeRecoveryEnvelope checks the recovery envelope decoder the same
// way.
func FuzzDecodeRecoveryEnvelope(f *testing.F) {
	b, err := coordinator.EncodeRecoveryEnvelope(coordinator.RecoveryEnvelope{TargetMeshName: "m", Activation: coordinator.Activation{
		Target:   coordinator.ActivationTarget{TargetSpotID: "s", StableType: "t", TargetNodeRID: "n", TargetNodeGeneration: 1},
		Deadline: unixMilli(1_700_000_000_000), Request: []byte("r"),
	}})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := coordinator.DecodeRecoveryEnvelope(b)
		if err != nil {
			return
		}
		again, err := coordinator.EncodeRecoveryEnvelope(e)
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("accepted non-canonical envelope %x (re-encoded %x, %v)", b, again, err)
		}
	})
}

func unixMilli(ms int64) time.Time { return time.UnixMilli(ms) }
