package authority_test

import (
	"bytes"
	"crypto/sha256"
	"strings"
	"testing"
	"time"

	authority "github.com/zlink-systems/authority"
)

// Seed messages.
const (
	msgPayload      = "Authority payload exceeds 1 MiB."
	msgCapacity     = "Placement capacity vector is invalid."
	msgObjectKind   = "Object kind must be actor, user_spot or instance_spot."
	msgRebind       = "Authority lease rebind must retain the owner and change the lease generation."
	msgOwnerTrans   = "Authority owner transitions require an aggregate CAS."
	msgMutationKind = "Authority mutation kind is invalid."
	msgReceipt      = "Object creation content receipt is invalid."
	msgActorCommit  = "Actor creation must use completeCreation."
	msgNotActor     = "completeCreation is reserved for Actor creation."
	msgCompletion   = "Creation completion kind is invalid."
	msgNoTerminal   = "Creation completion requires a terminal publication."
	msgRID          = "Creation terminal source node RID must contain 1..255 UTF-8 bytes without NUL."
	msgOpID         = "Creation terminal source generation and operation ID are invalid."
	msgEnvelope     = "Creation terminal envelope must not exceed 1 MiB and requires a SHA-256 digest."
	msgSHAMismatch  = "Creation terminal envelope SHA-256 does not match its bytes."
	msgExpiry       = "Creation terminal expiry must be the live operation deadline plus five minutes."
	msgAggGen       = "Aggregate generation and participant count are invalid."
	msgDigest       = "Aggregate inventory digest must contain 32 bytes."
	msgSorted       = "Aggregate participants must be unique and canonically sorted."
	msgParticipant  = "Aggregate participant owner transition must be preserve or newOwner."
	msgScanLimit    = "Authority scan limit must be in 1..1000."
	msgBlobSize     = "Relocation blob exceeds 1 MiB."
	msgBlobRet      = "Relocation blob retention must be positive."
	msgBlobRetFar   = "Relocation blob retention must not exceed 365 days."
	msgExpiryFar    = "Creation terminal expiry must not be more than 365 days away."
	msgKind         = "Authority object kind must be 1..64 characters of [a-z0-9_]."
)

func textMsg(name string) string { return name + " must be non-empty text without NUL." }

var validateNow = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func sized(n int) []byte { return bytes.Repeat([]byte{'p'}, n) }

func owner(gen int64) authority.OwnerToken {
	return authority.OwnerToken{OwnerID: "owner-1", LeaseGeneration: gen}
}

func target() authority.CreationTarget {
	return authority.CreationTarget{MeshName: "mesh", NodeRID: "node-1", NodeLifecycleGeneration: 1, Owner: owner(1)}
}

func validReserve() authority.ReserveRequest {
	return authority.ReserveRequest{
		Key: authority.ObjectKey{Kind: authority.ObjectUserSpot, GlobalID: "spot-1"},
		Intent: authority.CreationIntent{
			StableType:              "chat",
			RequestContentReference: "ref-1",
			RequestSHA256:           make([]byte, 32),
			RequestEncodedSize:      10,
		},
		Target:          target(),
		CreatingPayload: []byte("creating"),
		Capacity: authority.CapacityVector{Spots: 1, SpotType: &authority.SpotTypeCapacity{
			ObjectKind: authority.ObjectUserSpot, StableType: "chat", Count: 1,
		}},
	}
}

func validOperation() authority.CreationOperation {
	return authority.CreationOperation{
		SourceNodeRID:        "node-1",
		SourceNodeGeneration: 1,
		OperationID:          authority.CreationOperationID{High: 0, Low: 1},
	}
}

func validComplete() authority.CompleteCreationRequest {
	env := []byte("terminal envelope")
	sum := sha256.Sum256(env)
	return authority.CompleteCreationRequest{
		Key:                  authority.ObjectKey{Kind: authority.ObjectActor, GlobalID: "actor-1"},
		ReservationID:        "res-1",
		ExpectedStoreVersion: "v1",
		Target:               target(),
		Completion: authority.Completion{
			Kind:         authority.TerminalCreated,
			ReadyPayload: []byte("ready"),
			Terminal: &authority.TerminalPublication{
				Operation:              validOperation(),
				TerminalEnvelope:       env,
				TerminalEnvelopeSHA256: sum[:],
				OperationDeadline:      validateNow.Add(time.Minute),
			},
		},
	}
}

func validAggregate() authority.AggregatePrepareRequest {
	return authority.AggregatePrepareRequest{
		AggregateID:                         "agg-1",
		AggregateGeneration:                 1,
		TargetOwner:                         owner(2),
		TargetDescriptor:                    authority.NodeDescriptor{MeshName: "mesh", RID: "node-2"},
		TargetDescriptorLifecycleGeneration: 1,
		Capacity:                            authority.CapacityVector{Actors: 2},
		InventoryDigest:                     make([]byte, 32),
		Participants: []authority.AggregateParticipant{
			{AuthorityKey: "actor/a", ExpectedStoreVersion: "1", OwnerTransition: authority.TransitionNewOwner, AuthorityPayload: []byte("a")},
			{AuthorityKey: "actor/b", ExpectedStoreVersion: "2", OwnerTransition: authority.TransitionPreserve, AuthorityPayload: []byte("b")},
		},
	}
}

type validationCase struct {
	name string
	err  func() error
	msg  string // "" when the input is valid
}

func runValidationTable(t *testing.T, cases []validationCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.err()
			if c.msg == "" {
				if err != nil {
					t.Fatalf("valid input rejected: %v", err)
				}
				return
			}
			checkInvalid(t, err, c.msg)
		})
	}
}

func TestRequireTextAndSimpleValidators(t *testing.T) {
	runValidationTable(t, []validationCase{
		{"text ok", func() error { return authority.RequireText("x", "thing") }, ""},
		{"text empty", func() error { return authority.RequireText("", "thing") }, textMsg("thing")},
		{"text NUL", func() error { return authority.RequireText("a\x00", "thing") }, textMsg("thing")},
		{"text invalid UTF-8", func() error { return authority.RequireText("a\xff", "thing") }, "thing must be valid UTF-8."},
		{"payload nil", func() error { return authority.ValidatePayload(nil) }, ""},
		{"payload 1 MiB", func() error { return authority.ValidatePayload(sized(authority.MaxPayloadBytes)) }, ""},
		{"payload 1 MiB+1", func() error { return authority.ValidatePayload(sized(authority.MaxPayloadBytes + 1)) }, msgPayload},
		{"key ok", func() error { return authority.ValidateKey("actor/a") }, ""},
		{"key empty", func() error { return authority.ValidateKey("") }, textMsg("authority key")},
		{"key NUL", func() error { return authority.ValidateKey("actor/\x00") }, textMsg("authority key")},
		{"scan limit 0", func() error { return authority.ValidateScanLimit(0) }, msgScanLimit},
		{"scan limit -1", func() error { return authority.ValidateScanLimit(-1) }, msgScanLimit},
		{"scan limit 1", func() error { return authority.ValidateScanLimit(1) }, ""},
		{"scan limit 1000", func() error { return authority.ValidateScanLimit(1000) }, ""},
		{"scan limit 1001", func() error { return authority.ValidateScanLimit(1001) }, msgScanLimit},
		{"owner ok", func() error { return authority.ValidateOwner(owner(1)) }, ""},
		{"owner ok generation 0", func() error { return authority.ValidateOwner(authority.OwnerToken{OwnerID: "o"}) }, ""},
		{"owner empty", func() error { return authority.ValidateOwner(authority.OwnerToken{LeaseGeneration: 1}) }, textMsg("owner ID")},
		{"owner NUL", func() error { return authority.ValidateOwner(authority.OwnerToken{OwnerID: "o\x00"}) }, textMsg("owner ID")},
		{"fence ok", func() error {
			return authority.ValidateFence(authority.Fence{AggregateID: "a", AggregateGeneration: 1})
		}, ""},
		{"fence empty ID", func() error { return authority.ValidateFence(authority.Fence{AggregateGeneration: 1}) }, textMsg("aggregate ID")},
		{"fence NUL ID", func() error {
			return authority.ValidateFence(authority.Fence{AggregateID: "\x00", AggregateGeneration: 1})
		}, textMsg("aggregate ID")},
		{"fence generation 0", func() error { return authority.ValidateFence(authority.Fence{AggregateID: "a"}) }, msgAggGen},
		{"fence generation -1", func() error {
			return authority.ValidateFence(authority.Fence{AggregateID: "a", AggregateGeneration: -1})
		}, msgAggGen},
		{"blob ok", func() error { return authority.ValidateBlobPut([]byte("x"), time.Second) }, ""},
		{"blob empty ok", func() error { return authority.ValidateBlobPut(nil, time.Nanosecond) }, ""},
		{"blob 1 MiB", func() error { return authority.ValidateBlobPut(sized(authority.MaxPayloadBytes), time.Second) }, ""},
		{"blob 1 MiB+1", func() error { return authority.ValidateBlobPut(sized(authority.MaxPayloadBytes+1), time.Second) }, msgBlobSize},
		{"blob retention 0", func() error { return authority.ValidateBlobPut(nil, 0) }, msgBlobRet},
		{"blob retention negative", func() error { return authority.ValidateBlobPut(nil, -time.Second) }, msgBlobRet},
		{"blob retention MaxRetention", func() error { return authority.ValidateBlobPut(nil, authority.MaxRetention) }, ""},
		{"blob retention past MaxRetention", func() error {
			return authority.ValidateBlobPut(nil, authority.MaxRetention+time.Nanosecond)
		}, msgBlobRetFar},
	})
}

func spotType(count int64) *authority.SpotTypeCapacity {
	return &authority.SpotTypeCapacity{ObjectKind: authority.ObjectUserSpot, StableType: "chat", Count: count}
}

func TestValidateCapacityVector(t *testing.T) {
	const maxCount = 0x7fffffff
	v := func(c authority.CapacityVector) func() error {
		return func() error { return authority.ValidateCapacityVector(c) }
	}
	runValidationTable(t, []validationCase{
		{"one actor", v(authority.CapacityVector{Actors: 1}), ""},
		{"one spot", v(authority.CapacityVector{Spots: 1}), ""},
		{"spot type only", v(authority.CapacityVector{SpotType: spotType(1)}), ""},
		{"all", v(authority.CapacityVector{Actors: 1, Spots: 2, SpotType: spotType(3)}), ""},
		{"actors max", v(authority.CapacityVector{Actors: maxCount}), ""},
		{"actors max+1", v(authority.CapacityVector{Actors: maxCount + 1}), msgCapacity},
		{"spots max", v(authority.CapacityVector{Spots: maxCount}), ""},
		{"spots max+1", v(authority.CapacityVector{Spots: maxCount + 1}), msgCapacity},
		{"spot type max", v(authority.CapacityVector{SpotType: spotType(maxCount)}), ""},
		{"spot type max+1", v(authority.CapacityVector{SpotType: spotType(maxCount + 1)}), msgCapacity},
		{"spot type of a non-Spot kind", v(authority.CapacityVector{Actors: 1, SpotType: &authority.SpotTypeCapacity{ObjectKind: authority.ObjectActor, Count: 1}}), msgCapacity},
		{"actors negative", v(authority.CapacityVector{Actors: -1, Spots: 1}), msgCapacity},
		{"spots negative", v(authority.CapacityVector{Actors: 1, Spots: -1}), msgCapacity},
		{"spot type negative", v(authority.CapacityVector{Actors: 1, SpotType: spotType(-1)}), msgCapacity},
		{"all zero", v(authority.CapacityVector{}), msgCapacity},
		{"spot type count 0", v(authority.CapacityVector{Actors: 1, SpotType: spotType(0)}), msgCapacity},
		{"spot type kind NUL", v(authority.CapacityVector{SpotType: &authority.SpotTypeCapacity{ObjectKind: "user_spot\x00", StableType: "t", Count: 1}}), msgCapacity},
		{"spot type stable type NUL", v(authority.CapacityVector{SpotType: &authority.SpotTypeCapacity{ObjectKind: authority.ObjectUserSpot, StableType: "t\x00", Count: 1}}), msgCapacity},
	})
}

func TestValidateMutation(t *testing.T) {
	m := func(mu authority.Mutation) func() error {
		return func() error { return authority.ValidateMutation(mu) }
	}
	big := sized(authority.MaxPayloadBytes + 1)
	max := sized(authority.MaxPayloadBytes)
	runValidationTable(t, []validationCase{
		{"put", m(authority.Put([]byte("x"))), ""},
		{"put 1 MiB", m(authority.Put(max)), ""},
		{"put 1 MiB+1", m(authority.Put(big)), msgPayload},
		{"put without preserve", m(authority.Mutation{Kind: authority.MutationPut, Payload: []byte("x")}), msgOwnerTrans},
		{"put newOwner", m(authority.Mutation{Kind: authority.MutationPut, GenerationTransition: authority.TransitionNewOwner}), msgOwnerTrans},
		{"delete", m(authority.Delete()), ""},
		{"delete ignores payload", m(authority.Mutation{Kind: authority.MutationDelete, Payload: big}), ""},
		{"restore", m(authority.Restore(owner(1), []byte("x"))), ""},
		{"restore 1 MiB+1", m(authority.Restore(owner(1), big)), msgPayload},
		{"rebind", m(authority.RebindOwnerLease(owner(1), owner(2), []byte("x"))), ""},
		{"rebind to lower generation", m(authority.RebindOwnerLease(owner(2), owner(1), nil)), ""},
		{"rebind 1 MiB+1", m(authority.RebindOwnerLease(owner(1), owner(2), big)), msgPayload},
		{"rebind other owner", m(authority.RebindOwnerLease(owner(1), authority.OwnerToken{OwnerID: "other", LeaseGeneration: 2}, nil)), msgRebind},
		{"rebind same generation", m(authority.RebindOwnerLease(owner(1), owner(1), nil)), msgRebind},
		{"rebind expected generation 0", m(authority.RebindOwnerLease(owner(0), owner(1), nil)), msgRebind},
		{"rebind target generation 0", m(authority.RebindOwnerLease(owner(1), owner(0), nil)), msgRebind},
		{"rebind negative generation", m(authority.RebindOwnerLease(owner(-1), owner(1), nil)), msgRebind},
		{"unknown kind", m(authority.Mutation{Kind: "upsert", GenerationTransition: authority.TransitionPreserve}), msgMutationKind},
		{"empty kind", m(authority.Mutation{}), msgMutationKind},
		{"compare-exchange ok", func() error { return authority.ValidateCompareExchange("actor/a", authority.Put(nil)) }, ""},
		{"compare-exchange empty key", func() error { return authority.ValidateCompareExchange("", authority.Put(nil)) }, textMsg("authority key")},
		{"compare-exchange NUL key", func() error { return authority.ValidateCompareExchange("a\x00", authority.Delete()) }, textMsg("authority key")},
		{"compare-exchange bad mutation", func() error { return authority.ValidateCompareExchange("actor/a", authority.Mutation{Kind: "x"}) }, msgMutationKind},
	})
}

func TestMutationConstructors(t *testing.T) {
	p := []byte("p")
	if m := authority.Put(p); m.Kind != authority.MutationPut || !bytes.Equal(m.Payload, p) || m.GenerationTransition != authority.TransitionPreserve {
		t.Errorf("Put = %+v", m)
	}
	if m := authority.Delete(); m.Kind != authority.MutationDelete || m.Payload != nil {
		t.Errorf("Delete = %+v", m)
	}
	if m := authority.RebindOwnerLease(owner(1), owner(2), p); m.Kind != authority.MutationRebindOwnerLease ||
		m.ExpectedOwner != owner(1) || m.TargetOwner != owner(2) || !bytes.Equal(m.Payload, p) {
		t.Errorf("RebindOwnerLease = %+v", m)
	}
	if m := authority.Restore(owner(3), p); m.Kind != authority.MutationRestore ||
		m.ExpectedOwner != owner(3) || !bytes.Equal(m.Payload, p) || m.TargetOwner != (authority.OwnerToken{}) {
		t.Errorf("Restore = %+v", m)
	}
}

func TestValidateReserve(t *testing.T) {
	r := func(edit func(*authority.ReserveRequest)) func() error {
		return func() error {
			req := validReserve()
			edit(&req)
			key, err := authority.ValidateReserve(req)
			if err != nil && key != "" {
				t.Errorf("ValidateReserve returned key %q with error %v", key, err)
			}
			return err
		}
	}
	runValidationTable(t, []validationCase{
		{"valid", r(func(*authority.ReserveRequest) {}), ""},
		{"empty global ID", r(func(q *authority.ReserveRequest) { q.Key.GlobalID = "" }), textMsg("object global ID")},
		{"NUL global ID", r(func(q *authority.ReserveRequest) { q.Key.GlobalID = "a\x00" }), textMsg("object global ID")},
		{"bad kind", r(func(q *authority.ReserveRequest) { q.Key.Kind = "Spot" }), msgObjectKind},
		{"unknown kind", r(func(q *authority.ReserveRequest) { q.Key.Kind = "spot" }), msgObjectKind},
		{"global ID invalid UTF-8", r(func(q *authority.ReserveRequest) { q.Key.GlobalID = "\xc3" }), "object global ID must be valid UTF-8."},
		{"target mesh empty", r(func(q *authority.ReserveRequest) { q.Target.MeshName = "" }), textMsg("target mesh name")},
		{"target RID NUL", r(func(q *authority.ReserveRequest) { q.Target.NodeRID = "a\x00" }), textMsg("target node RID")},
		{"target owner invalid UTF-8", r(func(q *authority.ReserveRequest) { q.Target.Owner.OwnerID = "\xff" }), "target owner ID must be valid UTF-8."},
		{"empty stable type", r(func(q *authority.ReserveRequest) { q.Intent.StableType = "" }), textMsg("stable type")},
		{"NUL stable type", r(func(q *authority.ReserveRequest) { q.Intent.StableType = "\x00" }), textMsg("stable type")},
		{"empty content reference", r(func(q *authority.ReserveRequest) { q.Intent.RequestContentReference = "" }), textMsg("creation content reference")},
		{"NUL content reference", r(func(q *authority.ReserveRequest) { q.Intent.RequestContentReference = "r\x00" }), textMsg("creation content reference")},
		{"payload 1 MiB", r(func(q *authority.ReserveRequest) { q.CreatingPayload = sized(authority.MaxPayloadBytes) }), ""},
		{"payload 1 MiB+1", r(func(q *authority.ReserveRequest) { q.CreatingPayload = sized(authority.MaxPayloadBytes + 1) }), msgPayload},
		{"capacity all zero", r(func(q *authority.ReserveRequest) { q.Capacity = authority.CapacityVector{} }), msgCapacity},
		{"capacity spot type count 0", r(func(q *authority.ReserveRequest) { q.Capacity.SpotType.Count = 0 }), msgCapacity},
		{"sha 31 bytes", r(func(q *authority.ReserveRequest) { q.Intent.RequestSHA256 = make([]byte, 31) }), msgReceipt},
		{"sha 33 bytes", r(func(q *authority.ReserveRequest) { q.Intent.RequestSHA256 = make([]byte, 33) }), msgReceipt},
		{"sha missing", r(func(q *authority.ReserveRequest) { q.Intent.RequestSHA256 = nil }), msgReceipt},
		{"encoded size -1", r(func(q *authority.ReserveRequest) { q.Intent.RequestEncodedSize = -1 }), msgReceipt},
		{"encoded size 0", r(func(q *authority.ReserveRequest) { q.Intent.RequestEncodedSize = 0 }), ""},
		{"encoded size 1 MiB", r(func(q *authority.ReserveRequest) { q.Intent.RequestEncodedSize = authority.MaxPayloadBytes }), ""},
		{"encoded size 1 MiB+1", r(func(q *authority.ReserveRequest) { q.Intent.RequestEncodedSize = authority.MaxPayloadBytes + 1 }), msgReceipt},
	})
	key, err := authority.ValidateReserve(validReserve())
	if err != nil || key != "user_spot/spot-1" {
		t.Errorf("ValidateReserve(valid) = %q, %v", key, err)
	}
}

func TestValidateCommitAndAbort(t *testing.T) {
	commit := func(edit func(*authority.CommitRequest)) func() error {
		return func() error {
			req := authority.CommitRequest{
				Key:           authority.ObjectKey{Kind: authority.ObjectInstanceSpot, GlobalID: "i/1"},
				ReservationID: "res", ExpectedStoreVersion: "v", Target: target(), ReadyPayload: []byte("r"),
			}
			edit(&req)
			key, err := authority.ValidateCommit(req)
			if err == nil && key != "instance_spot/i%2F1" {
				t.Errorf("ValidateCommit key = %q", key)
			}
			return err
		}
	}
	abort := func(k authority.ObjectKey) func() error {
		return func() error {
			key, err := authority.ValidateAbort(authority.AbortRequest{Key: k, ReservationID: "r", Target: target()})
			if err == nil {
				if want, _ := k.Encode(); key != want {
					t.Errorf("ValidateAbort key = %q, want %q", key, want)
				}
			}
			return err
		}
	}
	runValidationTable(t, []validationCase{
		{"commit ok", commit(func(*authority.CommitRequest) {}), ""},
		{"commit payload 1 MiB", commit(func(q *authority.CommitRequest) { q.ReadyPayload = sized(authority.MaxPayloadBytes) }), ""},
		{"commit payload 1 MiB+1", commit(func(q *authority.CommitRequest) { q.ReadyPayload = sized(authority.MaxPayloadBytes + 1) }), msgPayload},
		{"commit actor", commit(func(q *authority.CommitRequest) { q.Key.Kind = authority.ObjectActor }), msgActorCommit},
		{"commit empty ID", commit(func(q *authority.CommitRequest) { q.Key.GlobalID = "" }), textMsg("object global ID")},
		{"commit bad kind", commit(func(q *authority.CommitRequest) { q.Key.Kind = "" }), msgObjectKind},
		{"abort ok", abort(authority.ObjectKey{Kind: authority.ObjectActor, GlobalID: "a"}), ""},
		{"abort empty ID", abort(authority.ObjectKey{Kind: authority.ObjectActor}), textMsg("object global ID")},
		{"abort bad kind", abort(authority.ObjectKey{Kind: "A", GlobalID: "a"}), msgObjectKind},
	})
}

func TestValidateCreationOperation(t *testing.T) {
	op := func(edit func(*authority.CreationOperation)) func() error {
		return func() error {
			o := validOperation()
			edit(&o)
			return authority.ValidateCreationOperation(o)
		}
	}
	runValidationTable(t, []validationCase{
		{"valid", op(func(*authority.CreationOperation) {}), ""},
		{"RID 1 byte", op(func(o *authority.CreationOperation) { o.SourceNodeRID = "x" }), ""},
		{"RID 255 bytes", op(func(o *authority.CreationOperation) { o.SourceNodeRID = strings.Repeat("r", 255) }), ""},
		{"RID 255 bytes multibyte", op(func(o *authority.CreationOperation) { o.SourceNodeRID = strings.Repeat("é", 127) + "x" }), ""},
		{"RID 256 bytes", op(func(o *authority.CreationOperation) { o.SourceNodeRID = strings.Repeat("r", 256) }), msgRID},
		{"RID 256 bytes multibyte", op(func(o *authority.CreationOperation) { o.SourceNodeRID = strings.Repeat("é", 128) }), msgRID},
		{"RID empty", op(func(o *authority.CreationOperation) { o.SourceNodeRID = "" }), msgRID},
		{"RID NUL", op(func(o *authority.CreationOperation) { o.SourceNodeRID = "a\x00b" }), msgRID},
		{"RID invalid UTF-8", op(func(o *authority.CreationOperation) { o.SourceNodeRID = "a\xffb" }), msgRID},
		{"generation 0", op(func(o *authority.CreationOperation) { o.SourceNodeGeneration = 0 }), msgOpID},
		{"generation -1", op(func(o *authority.CreationOperation) { o.SourceNodeGeneration = -1 }), msgOpID},
		{"generation max", op(func(o *authority.CreationOperation) { o.SourceNodeGeneration = authority.MaxGeneration }), ""},
		{"operation ID zero", op(func(o *authority.CreationOperation) { o.OperationID = authority.CreationOperationID{} }), msgOpID},
		{"operation ID high only", op(func(o *authority.CreationOperation) { o.OperationID = authority.CreationOperationID{High: 1} }), ""},
		{"operation ID max", op(func(o *authority.CreationOperation) {
			o.OperationID = authority.CreationOperationID{High: ^uint64(0), Low: ^uint64(0)}
		}), ""},
	})
}

func TestValidateCompleteCreation(t *testing.T) {
	cc := func(now time.Time, edit func(*authority.CompleteCreationRequest)) func() error {
		return func() error {
			req := validComplete()
			edit(&req)
			key, rec, err := authority.ValidateCompleteCreation(req, now)
			if err != nil && (key != "" || rec != nil) {
				t.Errorf("ValidateCompleteCreation returned %q, %+v with error %v", key, rec, err)
			}
			return err
		}
	}
	c := func(edit func(*authority.CompleteCreationRequest)) func() error { return cc(validateNow, edit) }
	deadlineAt := func(now time.Time) func(*authority.CompleteCreationRequest) {
		return func(q *authority.CompleteCreationRequest) {
			q.Completion.Terminal.OperationDeadline = now.Add(-authority.CreationTerminalRetention)
		}
	}
	envelope := func(env []byte) func(*authority.CompleteCreationRequest) {
		return func(q *authority.CompleteCreationRequest) {
			sum := sha256.Sum256(env)
			q.Completion.Terminal.TerminalEnvelope = env
			q.Completion.Terminal.TerminalEnvelopeSHA256 = sum[:]
		}
	}
	runValidationTable(t, []validationCase{
		{"created", c(func(*authority.CompleteCreationRequest) {}), ""},
		{"rejected", c(func(q *authority.CompleteCreationRequest) { q.Completion.Kind = authority.TerminalRejected }), ""},
		{"failed", c(func(q *authority.CompleteCreationRequest) { q.Completion.Kind = authority.TerminalFailed }), ""},
		{"not actor", c(func(q *authority.CompleteCreationRequest) { q.Key.Kind = authority.ObjectUserSpot }), msgNotActor},
		{"unknown completion", c(func(q *authority.CompleteCreationRequest) { q.Completion.Kind = "done" }), msgCompletion},
		{"created payload 1 MiB", c(func(q *authority.CompleteCreationRequest) {
			q.Completion.ReadyPayload = sized(authority.MaxPayloadBytes)
		}), ""},
		{"created payload 1 MiB+1", c(func(q *authority.CompleteCreationRequest) {
			q.Completion.ReadyPayload = sized(authority.MaxPayloadBytes + 1)
		}), msgPayload},
		{"rejected ignores payload", c(func(q *authority.CompleteCreationRequest) {
			q.Completion.Kind = authority.TerminalRejected
			q.Completion.ReadyPayload = sized(authority.MaxPayloadBytes + 1)
		}), ""},
		{"empty global ID", c(func(q *authority.CompleteCreationRequest) { q.Key.GlobalID = "" }), textMsg("object global ID")},
		{"no terminal", c(func(q *authority.CompleteCreationRequest) { q.Completion.Terminal = nil }), msgNoTerminal},
		{"bad operation RID", c(func(q *authority.CompleteCreationRequest) { q.Completion.Terminal.Operation.SourceNodeRID = "" }), msgRID},
		{"bad operation ID", c(func(q *authority.CompleteCreationRequest) {
			q.Completion.Terminal.Operation.OperationID = authority.CreationOperationID{}
		}), msgOpID},
		{"envelope empty", c(envelope(nil)), ""},
		{"envelope 1 MiB", c(envelope(sized(authority.MaxPayloadBytes))), ""},
		{"envelope 1 MiB+1", c(envelope(sized(authority.MaxPayloadBytes + 1))), msgEnvelope},
		{"digest 31 bytes", c(func(q *authority.CompleteCreationRequest) {
			q.Completion.Terminal.TerminalEnvelopeSHA256 = q.Completion.Terminal.TerminalEnvelopeSHA256[:31]
		}), msgEnvelope},
		{"digest 33 bytes", c(func(q *authority.CompleteCreationRequest) {
			q.Completion.Terminal.TerminalEnvelopeSHA256 = append(bytes.Clone(q.Completion.Terminal.TerminalEnvelopeSHA256), 0)
		}), msgEnvelope},
		{"digest missing", c(func(q *authority.CompleteCreationRequest) { q.Completion.Terminal.TerminalEnvelopeSHA256 = nil }), msgEnvelope},
		{"digest mismatch", c(func(q *authority.CompleteCreationRequest) {
			d := bytes.Clone(q.Completion.Terminal.TerminalEnvelopeSHA256)
			d[31] ^= 1
			q.Completion.Terminal.TerminalEnvelopeSHA256 = d
		}), msgSHAMismatch},
		{"digest of other bytes", c(func(q *authority.CompleteCreationRequest) { q.Completion.Terminal.TerminalEnvelope = []byte("other") }), msgSHAMismatch},
		{"zero deadline", c(func(q *authority.CompleteCreationRequest) { q.Completion.Terminal.OperationDeadline = time.Time{} }), msgExpiry},
		{"expiry == now", c(deadlineAt(validateNow)), msgExpiry},
		{"expiry == now+1ns", c(deadlineAt(validateNow.Add(time.Nanosecond))), ""},
		{"expiry before now", c(deadlineAt(validateNow.Add(-time.Hour))), msgExpiry},
		{"expiry == now+MaxRetention", c(deadlineAt(validateNow.Add(authority.MaxRetention))), ""},
		{"expiry past now+MaxRetention", c(deadlineAt(validateNow.Add(authority.MaxRetention + time.Nanosecond))), msgExpiryFar},
		{"deadline passed, expiry ahead", c(func(q *authority.CompleteCreationRequest) {
			q.Completion.Terminal.OperationDeadline = validateNow.Add(-time.Minute)
		}), ""},
		{"empty reservation ID", c(func(q *authority.CompleteCreationRequest) { q.ReservationID = "" }), textMsg("creation reservation ID")},
		{"NUL reservation ID", c(func(q *authority.CompleteCreationRequest) { q.ReservationID = "r\x00" }), textMsg("creation reservation ID")},
	})
}

func TestValidateCompleteCreationRecord(t *testing.T) {
	req := validComplete()
	req.Completion.Kind = authority.TerminalRejected
	key, rec, err := authority.ValidateCompleteCreation(req, validateNow)
	if err != nil {
		t.Fatal(err)
	}
	if key != "actor/actor-1" {
		t.Errorf("key = %q", key)
	}
	pub := req.Completion.Terminal
	if rec.State != authority.TerminalRejected || rec.Operation != pub.Operation || rec.ReservationID != "res-1" ||
		rec.ObjectKind != authority.ObjectActor ||
		!bytes.Equal(rec.TerminalEnvelope, pub.TerminalEnvelope) ||
		!bytes.Equal(rec.TerminalEnvelopeSHA256, pub.TerminalEnvelopeSHA256) ||
		!rec.ExpiresAt.Equal(pub.OperationDeadline.Add(5*time.Minute)) ||
		!rec.StoreNow.Equal(validateNow) {
		t.Errorf("record = %+v", rec)
	}
	// The record owns its bytes: changing the request afterwards does not
	// change it.
	pub.TerminalEnvelope[0] ^= 0xff
	pub.TerminalEnvelopeSHA256[0] ^= 0xff
	if rec.TerminalEnvelope[0] == pub.TerminalEnvelope[0] || rec.TerminalEnvelopeSHA256[0] == pub.TerminalEnvelopeSHA256[0] {
		t.Error("terminal record shares bytes with the request")
	}
}

func TestValidateAggregatePrepare(t *testing.T) {
	a := func(edit func(*authority.AggregatePrepareRequest)) func() error {
		return func() error {
			req := validAggregate()
			edit(&req)
			return authority.ValidateAggregatePrepare(req)
		}
	}
	parts := func(keys ...authority.Key) func(*authority.AggregatePrepareRequest) {
		return func(q *authority.AggregatePrepareRequest) {
			q.Participants = nil
			for _, k := range keys {
				q.Participants = append(q.Participants, authority.AggregateParticipant{AuthorityKey: k, OwnerTransition: authority.TransitionPreserve})
			}
		}
	}
	runValidationTable(t, []validationCase{
		{"valid", a(func(*authority.AggregatePrepareRequest) {}), ""},
		{"empty ID", a(func(q *authority.AggregatePrepareRequest) { q.AggregateID = "" }), textMsg("aggregate ID")},
		{"NUL ID", a(func(q *authority.AggregatePrepareRequest) { q.AggregateID = "\x00" }), textMsg("aggregate ID")},
		{"target owner empty", a(func(q *authority.AggregatePrepareRequest) { q.TargetOwner.OwnerID = "" }), textMsg("target owner ID")},
		{"target RID empty", a(func(q *authority.AggregatePrepareRequest) { q.TargetDescriptor.RID = "" }), textMsg("target node RID")},
		{"generation 0", a(func(q *authority.AggregatePrepareRequest) { q.AggregateGeneration = 0 }), msgAggGen},
		{"generation -1", a(func(q *authority.AggregatePrepareRequest) { q.AggregateGeneration = -1 }), msgAggGen},
		{"no participants", a(func(q *authority.AggregatePrepareRequest) { q.Participants = nil }), msgAggGen},
		{"digest 31 bytes", a(func(q *authority.AggregatePrepareRequest) { q.InventoryDigest = make([]byte, 31) }), msgDigest},
		{"digest 33 bytes", a(func(q *authority.AggregatePrepareRequest) { q.InventoryDigest = make([]byte, 33) }), msgDigest},
		{"digest missing", a(func(q *authority.AggregatePrepareRequest) { q.InventoryDigest = nil }), msgDigest},
		{"capacity all zero", a(func(q *authority.AggregatePrepareRequest) { q.Capacity = authority.CapacityVector{} }), msgCapacity},
		{"capacity negative", a(func(q *authority.AggregatePrepareRequest) { q.Capacity.Actors = -1 }), msgCapacity},
		{"one participant", a(parts("actor/a")), ""},
		{"sorted", a(parts("actor/a", "actor/b", "user_spot/a")), ""},
		{"sorted by bytes", a(parts("actor/B", "actor/a", "actor/é")), ""},
		{"sorted by bytes beyond BMP", a(parts("actor/\uffff", "actor/\U0001F600")), ""},
		{"unsorted", a(parts("actor/b", "actor/a")), msgSorted},
		{"unsorted later", a(parts("actor/a", "actor/c", "actor/b")), msgSorted},
		{"duplicate", a(parts("actor/a", "actor/a")), msgSorted},
		{"duplicate non-adjacent", a(parts("actor/a", "actor/b", "actor/a")), msgSorted},
		{"empty participant key", a(parts("", "actor/a")), textMsg("authority key")},
		{"NUL participant key", a(parts("actor/\x00")), textMsg("authority key")},
		{"transition empty", a(func(q *authority.AggregatePrepareRequest) { q.Participants[1].OwnerTransition = "" }), msgParticipant},
		{"transition unknown", a(func(q *authority.AggregatePrepareRequest) { q.Participants[0].OwnerTransition = "move" }), msgParticipant},
		{"participant payload 1 MiB", a(func(q *authority.AggregatePrepareRequest) {
			q.Participants[0].AuthorityPayload = sized(authority.MaxPayloadBytes)
		}), ""},
		{"participant payload 1 MiB+1", a(func(q *authority.AggregatePrepareRequest) {
			q.Participants[1].AuthorityPayload = sized(authority.MaxPayloadBytes + 1)
		}), msgPayload},
	})
}
