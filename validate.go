package authority

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// maxCapacityCount bounds each count of a capacity vector.
const maxCapacityCount = 0x7fff_ffff

// RequireText checks that value is non-empty text without NUL, in valid UTF-8;
// name is used in the error message.
func RequireText(value, name string) error {
	if value == "" || strings.IndexByte(value, 0) >= 0 {
		return Invalid(name + " must be non-empty text without NUL.")
	}
	if !utf8.ValidString(value) {
		return Invalid(name + " must be valid UTF-8.")
	}
	return nil
}

// validateTarget checks the node and owner a row is placed on: they are stored
// in the row and keyed in the owner index and capacity counters.
func validateTarget(node NodeDescriptor, owner OwnerToken) error {
	if err := RequireText(node.MeshName, "target mesh name"); err != nil {
		return err
	}
	if err := RequireText(node.RID, "target node RID"); err != nil {
		return err
	}
	return RequireText(owner.OwnerID, "target owner ID")
}

// ValidatePayload checks an authority payload's size.
func ValidatePayload(payload []byte) error {
	if len(payload) > MaxPayloadBytes {
		return Invalid("Authority payload exceeds 1 MiB.")
	}
	return nil
}

// ValidateKey checks an authority key given to a read, a compare-exchange or
// an aggregate participant.
func ValidateKey(key Key) error { return RequireText(string(key), "authority key") }

// ValidateCapacityVector checks a placement capacity vector: every count in
// 0..2^31-1, not all zero, a Spot type count non-zero when present. The
// error keeps the seed's message and names the rule broken as its cause.
func ValidateCapacityVector(c CapacityVector) error {
	const message = "Placement capacity vector is invalid."
	names := []string{"Actors", "Spots", "SpotType.Count"}
	counts := []int64{c.Actors, c.Spots, 0}
	if c.SpotType != nil {
		counts[2] = c.SpotType.Count
	}
	allZero := true
	for i, n := range counts {
		if n < 0 || n > maxCapacityCount {
			return invalidRule(message, "%s is %d, outside 0..%d", names[i], n, maxCapacityCount)
		}
		if n != 0 {
			allZero = false
		}
	}
	if allZero {
		return invalidRule(message, "Every count is zero; a placement takes some capacity")
	}
	if c.SpotType == nil {
		return nil
	}
	switch st := c.SpotType; {
	case st.Count == 0:
		return invalidRule(message, "SpotType.Count is zero; a Spot type takes some capacity")
	case !st.ObjectKind.IsSpot():
		return invalidRule(message, "SpotType.ObjectKind %q is not a Spot kind (user_spot or instance_spot)", st.ObjectKind)
	case strings.IndexByte(st.StableType, 0) >= 0:
		return invalidRule(message, "SpotType.StableType contains NUL")
	case !utf8.ValidString(st.StableType):
		return invalidRule(message, "SpotType.StableType is not valid UTF-8")
	}
	return nil
}

// invalidRule returns an error wrapping ErrInvalidArgument with message (the
// seed's, shared by several rules) and, as its cause, the rule the input
// broke (format and args).
func invalidRule(message, format string, args ...any) error {
	return Wrap(ErrInvalidArgument, message, fmt.Errorf(format, args...))
}

// ValidateMutation checks a compare-exchange mutation: owner transitions only
// through aggregates, lease rebinds keeping the owner and changing the lease
// generation, payload size.
func ValidateMutation(m Mutation) error {
	switch m.Kind {
	case MutationDelete:
		return nil
	case MutationRestore:
	case MutationRebindOwnerLease:
		if err := validateLeaseRebind(m.ExpectedOwner, m.TargetOwner); err != nil {
			return err
		}
	case MutationPut:
		if m.GenerationTransition != TransitionPreserve {
			return Invalid("Authority owner transitions require an aggregate CAS.")
		}
	default:
		return Invalid("Authority mutation kind is invalid.")
	}
	return ValidatePayload(m.Payload)
}

// validateLeaseRebind checks a lease rebind from expected to target: the
// owner kept, the lease generation changed, both generations at least 1.
func validateLeaseRebind(expected, target OwnerToken) error {
	const message = "Authority lease rebind must retain the owner and change the lease generation."
	switch {
	case expected.OwnerID != target.OwnerID:
		return invalidRule(message, "Target owner %q is not the expected owner %q", target.OwnerID, expected.OwnerID)
	case expected.LeaseGeneration <= 0 || target.LeaseGeneration <= 0:
		return invalidRule(message, "Lease generations must be at least 1 (expected %d, target %d)", expected.LeaseGeneration, target.LeaseGeneration)
	case expected.LeaseGeneration == target.LeaseGeneration:
		return invalidRule(message, "Expected and target are both lease generation %d", target.LeaseGeneration)
	}
	return nil
}

// ValidateCompareExchange checks every input of CompareExchangeAuthority.
func ValidateCompareExchange(key Key, m Mutation) error {
	if err := ValidateKey(key); err != nil {
		return err
	}
	return ValidateMutation(m)
}

// validateObjectKey checks that an object key names one of the framework's
// object kinds and encodes it.
func validateObjectKey(k ObjectKey) (Key, error) {
	switch k.Kind {
	case ObjectActor, ObjectUserSpot, ObjectInstanceSpot:
		return k.Encode()
	}
	return "", Invalid("Object kind must be actor, user_spot or instance_spot.")
}

// ValidateReserve checks a reserve request and returns the encoded key.
func ValidateReserve(req ReserveRequest) (Key, error) {
	key, err := validateObjectKey(req.Key)
	if err != nil {
		return "", err
	}
	if err := RequireText(req.Intent.StableType, "stable type"); err != nil {
		return "", err
	}
	if err := RequireText(req.Intent.RequestContentReference, "creation content reference"); err != nil {
		return "", err
	}
	if err := ValidatePayload(req.CreatingPayload); err != nil {
		return "", err
	}
	if err := ValidateCapacityVector(req.Capacity); err != nil {
		return "", err
	}
	if err := validateTarget(req.Target.Descriptor(), req.Target.Owner); err != nil {
		return "", err
	}
	if err := validateContentReceipt(req.Intent); err != nil {
		return "", err
	}
	return key, nil
}

// validateContentReceipt checks a creation intent's content receipt: a
// SHA-256 digest and an encoded size in 0..1 MiB.
func validateContentReceipt(in CreationIntent) error {
	const message = "Object creation content receipt is invalid."
	if n := len(in.RequestSHA256); n != sha256.Size {
		return invalidRule(message, "RequestSHA256 has %d bytes, not a SHA-256 digest's %d", n, sha256.Size)
	}
	if in.RequestEncodedSize < 0 || in.RequestEncodedSize > MaxPayloadBytes {
		return invalidRule(message, "RequestEncodedSize is %d, outside 0..%d", in.RequestEncodedSize, MaxPayloadBytes)
	}
	return nil
}

// ValidateCommit checks a commit request and returns the encoded key.
func ValidateCommit(req CommitRequest) (Key, error) {
	if err := ValidatePayload(req.ReadyPayload); err != nil {
		return "", err
	}
	if req.Key.Kind == ObjectActor {
		return "", Invalid("Actor creation must use completeCreation.")
	}
	return validateObjectKey(req.Key)
}

// ValidateAbort checks an abort request and returns the encoded key.
func ValidateAbort(req AbortRequest) (Key, error) { return validateObjectKey(req.Key) }

// ValidateTerminalExpiry checks that a creation terminal expiring at
// expiresAt is still live at now. A provider that validated a request before
// waiting for its write to take effect checks again at the write's time.
func ValidateTerminalExpiry(expiresAt, now time.Time) error {
	if !expiresAt.After(now) {
		return invalidRule("Creation terminal expiry must be the live operation deadline plus five minutes.",
			"It expires at %s, not after the store's now %s", expiresAt.Format(time.RFC3339Nano), now.Format(time.RFC3339Nano))
	}
	if expiresAt.Sub(now) > MaxRetention {
		return Invalid("Creation terminal expiry must not be more than 365 days away.")
	}
	return nil
}

// ValidateCompleteCreation checks a completeCreation request against the
// store's clock and returns the encoded key and the terminal record it
// publishes (expiring at the operation deadline plus five minutes).
func ValidateCompleteCreation(req CompleteCreationRequest, now time.Time) (Key, *TerminalRecord, error) {
	if req.Key.Kind != ObjectActor {
		return "", nil, Invalid("completeCreation is reserved for Actor creation.")
	}
	switch req.Completion.Kind {
	case TerminalCreated:
		if err := ValidatePayload(req.Completion.ReadyPayload); err != nil {
			return "", nil, err
		}
	case TerminalRejected, TerminalFailed:
	default:
		return "", nil, Invalid("Creation completion kind is invalid.")
	}
	key, err := validateObjectKey(req.Key)
	if err != nil {
		return "", nil, err
	}
	pub := req.Completion.Terminal
	if pub == nil {
		return "", nil, Invalid("Creation completion requires a terminal publication.")
	}
	if err := ValidateCreationOperation(pub.Operation); err != nil {
		return "", nil, err
	}
	if err := validateEnvelope(pub); err != nil {
		return "", nil, err
	}
	actual := sha256.Sum256(pub.TerminalEnvelope)
	if subtle.ConstantTimeCompare(actual[:], pub.TerminalEnvelopeSHA256) != 1 {
		return "", nil, Invalid("Creation terminal envelope SHA-256 does not match its bytes.")
	}
	if pub.OperationDeadline.IsZero() {
		return "", nil, invalidRule("Creation terminal expiry must be the live operation deadline plus five minutes.",
			"OperationDeadline is not set")
	}
	expiresAt := pub.OperationDeadline.Add(CreationTerminalRetention)
	if err := ValidateTerminalExpiry(expiresAt, now); err != nil {
		return "", nil, err
	}
	if err := RequireText(req.ReservationID, "creation reservation ID"); err != nil {
		return "", nil, err
	}
	return key, &TerminalRecord{
		State:                  req.Completion.Kind,
		Operation:              pub.Operation,
		ReservationID:          req.ReservationID,
		ObjectKind:             req.Key.Kind,
		TerminalEnvelope:       bytes.Clone(pub.TerminalEnvelope),
		TerminalEnvelopeSHA256: bytes.Clone(pub.TerminalEnvelopeSHA256),
		ExpiresAt:              expiresAt,
		StoreNow:               now,
	}, nil
}

// validateEnvelope checks a terminal publication's envelope: at most 1 MiB,
// with a SHA-256 digest.
func validateEnvelope(pub *TerminalPublication) error {
	const message = "Creation terminal envelope must not exceed 1 MiB and requires a SHA-256 digest."
	if n := len(pub.TerminalEnvelope); n > MaxPayloadBytes {
		return invalidRule(message, "TerminalEnvelope has %d bytes, over %d", n, MaxPayloadBytes)
	}
	if n := len(pub.TerminalEnvelopeSHA256); n != sha256.Size {
		return invalidRule(message, "TerminalEnvelopeSHA256 has %d bytes, not a SHA-256 digest's %d", n, sha256.Size)
	}
	return nil
}

// ValidateCreationOperation checks a creation operation identity: source RID
// of 1..255 UTF-8 bytes without NUL, source generation in 1..MaxGeneration,
// operation ID non-zero.
func ValidateCreationOperation(op CreationOperation) error {
	rid := op.SourceNodeRID
	if len(rid) < 1 || len(rid) > 255 || strings.IndexByte(rid, 0) >= 0 || !utf8.ValidString(rid) {
		return Invalid("Creation terminal source node RID must contain 1..255 UTF-8 bytes without NUL.")
	}
	const message = "Creation terminal source generation and operation ID are invalid."
	if op.SourceNodeGeneration < 1 {
		return invalidRule(message, "SourceNodeGeneration is %d, below 1", op.SourceNodeGeneration)
	}
	if op.OperationID == (CreationOperationID{}) {
		return invalidRule(message, "OperationID is zero")
	}
	return nil
}

// aggregateCountsMessage is the seed's message for an aggregate generation
// or participant count out of range.
const aggregateCountsMessage = "Aggregate generation and participant count are invalid."

// ValidateAggregatePrepare checks an aggregate prepare request: ID, generation
// and participant count, 32-byte inventory digest, capacity vector, and
// participants unique and sorted by key (byte order), each with a valid key,
// owner transition and payload.
func ValidateAggregatePrepare(req AggregatePrepareRequest) error {
	if err := RequireText(req.AggregateID, "aggregate ID"); err != nil {
		return err
	}
	if req.AggregateGeneration < 1 {
		return invalidRule(aggregateCountsMessage, "AggregateGeneration is %d, below 1", req.AggregateGeneration)
	}
	if len(req.Participants) < 1 {
		return invalidRule(aggregateCountsMessage, "Participants is empty; an aggregate has at least one")
	}
	if len(req.InventoryDigest) != sha256.Size {
		return Invalid("Aggregate inventory digest must contain 32 bytes.")
	}
	if err := ValidateCapacityVector(req.Capacity); err != nil {
		return err
	}
	if err := validateTarget(req.TargetDescriptor, req.TargetOwner); err != nil {
		return err
	}
	for i, p := range req.Participants {
		if err := ValidateKey(p.AuthorityKey); err != nil {
			return err
		}
		if i > 0 && req.Participants[i-1].AuthorityKey >= p.AuthorityKey {
			return Invalid("Aggregate participants must be unique and canonically sorted.")
		}
		if p.OwnerTransition != TransitionPreserve && p.OwnerTransition != TransitionNewOwner {
			return Invalid("Aggregate participant owner transition must be preserve or newOwner.")
		}
		if err := ValidatePayload(p.AuthorityPayload); err != nil {
			return err
		}
	}
	return nil
}

// ValidateFence checks an aggregate fence.
func ValidateFence(f Fence) error {
	if err := RequireText(f.AggregateID, "aggregate ID"); err != nil {
		return err
	}
	if f.AggregateGeneration < 1 {
		return invalidRule(aggregateCountsMessage, "AggregateGeneration is %d, below 1", f.AggregateGeneration)
	}
	return nil
}

// ValidateScanLimit checks a listing page size.
func ValidateScanLimit(limit int) error {
	if limit < 1 || limit > MaxScanLimit {
		return Invalid("Authority scan limit must be in 1..1000.")
	}
	return nil
}

// ValidateScanPrefix checks a listing's key prefix: it must not contain NUL
// (the etcd provider's cursors and key ranges use NUL as a separator).
func ValidateScanPrefix(prefix string) error {
	if strings.IndexByte(prefix, 0) >= 0 {
		return Invalid("Authority scan prefix must not contain NUL.")
	}
	return nil
}

// ValidateOwner checks the owner token given to RemoveAllByOwner.
func ValidateOwner(owner OwnerToken) error { return RequireText(owner.OwnerID, "owner ID") }

// ValidateBlobPut checks a relocation blob put.
func ValidateBlobPut(data []byte, retention time.Duration) error {
	if len(data) > MaxPayloadBytes {
		return Invalid("Relocation blob exceeds 1 MiB.")
	}
	if retention <= 0 {
		return Invalid("Relocation blob retention must be positive.")
	}
	if retention > MaxRetention {
		return Invalid("Relocation blob retention must not exceed 365 days.")
	}
	return nil
}
