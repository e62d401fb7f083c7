package authority

import (
	"bytes"
	"time"
)

// MaxGeneration is the largest store version, object generation or owner
// generation a provider hands out (2^63-1). Past it, writes report
// generationExhausted.
const MaxGeneration int64 = 0x7fff_ffff_ffff_ffff

// MaxPayloadBytes bounds authority payloads, creation request sizes and
// terminal envelopes (1 MiB).
const MaxPayloadBytes = 1024 * 1024

// MaxRetention bounds how long a store is asked to keep a record: a
// relocation blob's retention, a creation terminal's expiry and a store's
// reservation retention (365 days). Longer ones are ErrInvalidArgument: etcd
// keeps such records on leases, whose TTL it bounds, and a record must not
// vanish before the expiry its receipt promised.
const MaxRetention = 365 * 24 * time.Hour

// CreationTerminalRetention is how long a creation terminal outlives its
// operation deadline.
const CreationTerminalRetention = 5 * time.Minute

// MaxScanLimit bounds the page size of ListAuthorities.
const MaxScanLimit = 1000

// StoreVersion identifies one state of one row. It is opaque: compare it for
// equality only. Every write of a row gives it a new version; the version is
// equal only when the row did not change. The zero value is no version.
type StoreVersion string

// String returns the version text.
func (v StoreVersion) String() string { return string(v) }

// OwnerToken names the owner of a row: an owner ID and the generation of the
// owner's lease. A new lease generation is a new token for the same owner.
// In a request, take it from the owner's lease (the etcd provider's
// OwnerLease.Token); the memory provider's LivenessOracle decides which
// tokens are live.
type OwnerToken struct {
	// OwnerID names the owner (for example a node's runtime): non-empty
	// UTF-8 text without NUL.
	OwnerID string
	// LeaseGeneration is the generation of the owner's lease the token
	// stands for (etcd: handed out by Registry.Acquire, 1, 2, ...; a rebind
	// needs it ≥ 1).
	LeaseGeneration int64
}

// NodeDescriptor names a cluster node: its mesh and its RID.
type NodeDescriptor struct {
	// MeshName is the mesh (cluster) the node belongs to: non-empty UTF-8
	// text without NUL.
	MeshName string
	// RID is the node's runtime ID within the mesh: non-empty UTF-8 text
	// without NUL.
	RID string
}

// SpotTypeCapacity is the per-Spot-type part of a capacity vector.
type SpotTypeCapacity struct {
	// ObjectKind is the Spot kind counted (ObjectUserSpot or
	// ObjectInstanceSpot); any other kind is invalid.
	ObjectKind ObjectKind
	// StableType is the Spot's stable type (the reservation's
	// CreationIntent.StableType): UTF-8 without NUL.
	StableType string
	// Count is how many of that kind and type the object takes: 1..2^31-1.
	Count int64
}

// CapacityVector is the placement capacity an object consumes on its node.
// Every count is 0..2^31-1 and at least one is non-zero (ErrInvalidArgument
// otherwise). The caller's placement decides it (an Actor usually {Actors:
// 1}, a Spot {Spots: 1, SpotType: {kind, type, 1}}); the store counts it
// against the node's capacity until the row goes.
type CapacityVector struct {
	// Actors is the number of Actor slots taken.
	Actors int64
	// Spots is the number of Spot slots taken (any type).
	Spots int64
	// SpotType, when set, is the per-type count; nil: none.
	SpotType *SpotTypeCapacity
}

// Clone returns a deep copy.
func (c CapacityVector) Clone() CapacityVector {
	if c.SpotType != nil {
		st := *c.SpotType
		c.SpotType = &st
	}
	return c
}

// Equal reports whether two vectors are the same.
func (c CapacityVector) Equal(o CapacityVector) bool {
	if c.Actors != o.Actors || c.Spots != o.Spots {
		return false
	}
	if c.SpotType == nil || o.SpotType == nil {
		return c.SpotType == nil && o.SpotType == nil
	}
	return *c.SpotType == *o.SpotType
}

// AllocationState is the placement state of a row.
type AllocationState string

// Allocation states.
const (
	AllocationReserved AllocationState = "reserved"
	AllocationActive   AllocationState = "active"
)

// PlacementAllocation is where a row's object lives and what it consumes.
// DescriptorLifecycleGeneration is the node lifecycle the row is on (see
// CreationTarget.NodeLifecycleGeneration): it stays there until an
// aggregate moves it.
type PlacementAllocation struct {
	State                         AllocationState
	ObjectKind                    ObjectKind
	StableType                    string
	Descriptor                    NodeDescriptor
	DescriptorLifecycleGeneration int64
	Capacity                      CapacityVector
}

// Clone returns a deep copy.
func (a PlacementAllocation) Clone() PlacementAllocation {
	a.Capacity = a.Capacity.Clone()
	return a
}

// PendingCreation is the creation receipt of a reserved row.
type PendingCreation struct {
	ReservationID           string
	RequestContentReference string
	RequestSHA256           []byte
	RequestEncodedSize      int64
}

// Snapshot is one state of one authority row.
type Snapshot struct {
	StoreVersion             StoreVersion
	Payload                  []byte
	ObjectGeneration         int64
	AuthorityOwnerGeneration int64
	OwnerID                  string
	OwnerLeaseGeneration     int64
	// OwnershipToken is the row's fencing token: the number its owner sends
	// with every effect outside the store, so that a system receiving the
	// effect can refuse one from an owner that has since been replaced (see
	// package fencing). Per key, it is the store-version number of the write
	// that last changed the row's OwnerID or OwnerLeaseGeneration. The token
	// changes exactly when the owner ID or the lease generation changes: a
	// reserve (also a re-create after a remove), an aggregate newOwner commit
	// to another owner ID or lease generation, a rebind to a new owner lease.
	// So, over the successive states of one key (across removal and
	// re-creation too):
	//   - it is positive;
	//   - it strictly increases whenever OwnerID or OwnerLeaseGeneration
	//     changes, and never repeats for the key;
	//   - it stays equal across every other write (commit, completion,
	//     compare-exchange puts and restores, an aggregate's preserve
	//     transition, and its newOwner transition to the row's current owner:
	//     same owner ID and lease generation; on etcd from store version
	//     TokenFollowsOwner on).
	// Tokens of different keys are unrelated. AuthorityOwnerGeneration
	// cannot serve: a rebind to a new lease does not change it.
	OwnershipToken int64
	Allocation     PlacementAllocation
	// PendingCreation is set while the row is reserved.
	PendingCreation *PendingCreation
	// StoreNow is the store's clock when the snapshot was read.
	StoreNow time.Time
}

// Owner returns the row's owner token.
func (s *Snapshot) Owner() OwnerToken {
	return OwnerToken{OwnerID: s.OwnerID, LeaseGeneration: s.OwnerLeaseGeneration}
}

// Clone returns a deep copy.
func (s *Snapshot) Clone() *Snapshot {
	if s == nil {
		return nil
	}
	c := *s
	c.Payload = bytes.Clone(s.Payload)
	c.Allocation = s.Allocation.Clone()
	if s.PendingCreation != nil {
		p := *s.PendingCreation
		p.RequestSHA256 = bytes.Clone(p.RequestSHA256)
		c.PendingCreation = &p
	}
	return &c
}

// CreationIntent describes the creation request a reservation carries. The
// caller stores the encoded creation request first (inline, or as a relocation
// blob) and puts its receipt here; the reserved row keeps it as its
// PendingCreation, so whoever finishes the creation can find and check the
// request.
type CreationIntent struct {
	// StableType is the object's stable type (its class in the framework):
	// non-empty UTF-8 text without NUL.
	StableType string
	// RequestContentReference says where the encoded creation request is
	// (for example a relocation BlobReference, or the coordinator's inline
	// content reference): non-empty UTF-8 text without NUL, opaque to the
	// store.
	RequestContentReference string
	// RequestSHA256 is the SHA-256 of the encoded creation request: exactly
	// 32 bytes.
	RequestSHA256 []byte
	// RequestEncodedSize is the encoded creation request's length in bytes:
	// 0..MaxPayloadBytes.
	RequestEncodedSize int64
}

// CreationTarget is the node and owner a reservation places an object on.
// Reserve needs the owner live on the node at that lifecycle generation;
// commit, completeCreation and abort repeat the reservation's target.
type CreationTarget struct {
	// MeshName is the target node's mesh: non-empty UTF-8 text without NUL.
	MeshName string
	// NodeRID is the target node's RID: non-empty UTF-8 text without NUL.
	NodeRID string
	// NodeLifecycleGeneration is the target node's lifecycle generation:
	// the scope of the node's rows and capacity, set by the node's runtime
	// (etcd: the lifecycle given to Registry.Acquire). A restart that keeps
	// the node's rows keeps it; a node that starts without them takes a new
	// one. A row stays on its lifecycle: lease generations of one lifecycle
	// pass rows on with a rebind, and rows move to another lifecycle with an
	// aggregate (README, "Node lifecycles and lease generations").
	NodeLifecycleGeneration int64
	// Owner is the lease the row is placed under (its OwnerID non-empty):
	// the target node's current owner lease.
	Owner OwnerToken
}

// Descriptor returns the target's node descriptor.
func (t CreationTarget) Descriptor() NodeDescriptor {
	return NodeDescriptor{MeshName: t.MeshName, RID: t.NodeRID}
}

// CreationOperationID is the 128-bit operation ID of a creation operation,
// chosen by the source node (random, or a counter it never reuses); it must
// not be zero.
type CreationOperationID struct {
	// High is the upper 64 bits.
	High uint64
	// Low is the lower 64 bits.
	Low uint64
}

// CreationOperation identifies one creation operation of a source node: the
// node that asked for the creation and waits for its terminal.
type CreationOperation struct {
	// SourceNodeRID is the RID of the node that started the operation: 1..255
	// bytes of UTF-8 without NUL.
	SourceNodeRID string
	// SourceNodeGeneration is that node's lifecycle generation:
	// 1..MaxGeneration.
	SourceNodeGeneration int64
	// OperationID is the operation's ID on that node; not zero.
	OperationID CreationOperationID
}

// TerminalPublication is the terminal a completeCreation publishes: readable
// with ReadCreationTerminal(Operation) until OperationDeadline plus
// CreationTerminalRetention.
type TerminalPublication struct {
	// Operation is the creation operation the terminal answers (the one the
	// source node waits on).
	Operation CreationOperation
	// TerminalEnvelope is the terminal's encoded body, opaque to the store
	// (the coordinator's terminal envelope): at most MaxPayloadBytes.
	TerminalEnvelope []byte
	// TerminalEnvelopeSHA256 is SHA-256(TerminalEnvelope): exactly 32 bytes,
	// and it must match.
	TerminalEnvelopeSHA256 []byte
	// OperationDeadline is the operation's deadline (set by its source
	// node). Not zero; the terminal expires at OperationDeadline +
	// CreationTerminalRetention, which must be after the store's clock and
	// at most MaxRetention away.
	OperationDeadline time.Time
}

// TerminalState is the outcome a creation terminal records.
type TerminalState string

// Terminal states (the completion kinds).
const (
	TerminalCreated  TerminalState = "created"
	TerminalRejected TerminalState = "rejected"
	TerminalFailed   TerminalState = "failed"
)

// TerminalRecord is a published creation terminal.
type TerminalRecord struct {
	State                  TerminalState
	Operation              CreationOperation
	ReservationID          string
	ObjectKind             ObjectKind
	TerminalEnvelope       []byte
	TerminalEnvelopeSHA256 []byte
	ExpiresAt              time.Time
	// StoreNow is the store's clock when the terminal was published.
	StoreNow time.Time
}

// Clone returns a deep copy.
func (r *TerminalRecord) Clone() *TerminalRecord {
	if r == nil {
		return nil
	}
	c := *r
	c.TerminalEnvelope = bytes.Clone(r.TerminalEnvelope)
	c.TerminalEnvelopeSHA256 = bytes.Clone(r.TerminalEnvelopeSHA256)
	return &c
}

// MutationKind names a compare-exchange mutation.
type MutationKind string

// Mutation kinds.
const (
	MutationPut              MutationKind = "put"
	MutationDelete           MutationKind = "delete"
	MutationRebindOwnerLease MutationKind = "rebindOwnerLease"
	MutationRestore          MutationKind = "restore"
)

// GenerationTransition names what a write does to the row's owner.
type GenerationTransition string

// Generation transitions. A compare-exchange put only accepts Preserve; owner
// changes go through aggregates.
const (
	TransitionPreserve GenerationTransition = "preserve"
	TransitionNewOwner GenerationTransition = "newOwner"
)

// Mutation is the change a CompareExchangeAuthority applies to an active row.
// Build it with Put, Delete, RebindOwnerLease or Restore.
type Mutation struct {
	// Kind is put, delete, rebindOwnerLease or restore; anything else is
	// ErrInvalidArgument.
	Kind MutationKind
	// Payload is the new payload (put, rebindOwnerLease, restore): at most
	// MaxPayloadBytes. Ignored by delete.
	Payload []byte
	// GenerationTransition must be TransitionPreserve for a put.
	GenerationTransition GenerationTransition
	// ExpectedOwner is the row's current owner (rebindOwnerLease, restore):
	// the Snapshot's Owner(). For a rebind its LeaseGeneration is ≥ 1.
	ExpectedOwner OwnerToken
	// TargetOwner is the owner's new lease (rebindOwnerLease): the same
	// OwnerID, another LeaseGeneration ≥ 1, and live.
	TargetOwner OwnerToken
}

// Put returns a payload put that preserves the owner.
func Put(payload []byte) Mutation {
	return Mutation{Kind: MutationPut, Payload: payload, GenerationTransition: TransitionPreserve}
}

// Delete returns a delete mutation.
func Delete() Mutation { return Mutation{Kind: MutationDelete} }

// RebindOwnerLease returns a mutation moving a row from one lease generation of
// its owner to another.
func RebindOwnerLease(expected, target OwnerToken, payload []byte) Mutation {
	return Mutation{Kind: MutationRebindOwnerLease, ExpectedOwner: expected, TargetOwner: target, Payload: payload}
}

// Restore returns a mutation that rewrites the payload of a row owned by
// expected, whether or not that owner is still live.
func Restore(expected OwnerToken, payload []byte) Mutation {
	return Mutation{Kind: MutationRestore, ExpectedOwner: expected, Payload: payload}
}

// ScanCursor is an opaque continuation of ListAuthorities. The zero value
// starts a listing.
type ScanCursor string

// ScanItem is one row of a listing page.
type ScanItem struct {
	Key      Key
	Snapshot *Snapshot
}

// CapacityUsage is the capacity counted against one counter.
type CapacityUsage struct {
	Active   int64
	Reserved int64
}

// ReserveRequest asks to reserve a new object on a target node.
type ReserveRequest struct {
	// Key is the new object: Kind ObjectActor, ObjectUserSpot or
	// ObjectInstanceSpot, GlobalID non-empty UTF-8 text without NUL.
	Key ObjectKey
	// Intent is the receipt of the stored creation request.
	Intent CreationIntent
	// Target is the node and owner lease the object is placed on; the owner
	// must be live there.
	Target CreationTarget
	// CreatingPayload is the reserved row's payload until the creation ends
	// (the caller's "creating" state): at most MaxPayloadBytes.
	CreatingPayload []byte
	// Capacity is what the object takes on the target node (valid as
	// ValidateCapacityVector says); counted as reserved, then active.
	Capacity CapacityVector
}

// CommitRequest commits a reserved non-Actor object. Its fields repeat the
// reservation: ReserveResult and the ReserveRequest it answered.
type CommitRequest struct {
	// Key is the reserved object's key; a Spot kind (an Actor finishes with
	// CompleteCreation).
	Key ObjectKey
	// ReservationID is ReserveResult.ReservationID; another one is stale.
	ReservationID string
	// ExpectedStoreVersion is the reserved row's version,
	// ReserveResult.Creating.StoreVersion.
	ExpectedStoreVersion StoreVersion
	// Target is the reservation's target (ReserveRequest.Target).
	Target CreationTarget
	// ReadyPayload is the active row's payload: at most MaxPayloadBytes.
	ReadyPayload []byte
}

// CompletionKind is the outcome a completeCreation reports.
type CompletionKind = TerminalState

// Completion is the outcome of an Actor creation.
type Completion struct {
	// Kind is TerminalCreated (the row becomes active), TerminalRejected or
	// TerminalFailed (the row is deleted, its capacity released).
	Kind CompletionKind
	// ReadyPayload is the ready payload (created only): at most
	// MaxPayloadBytes.
	ReadyPayload []byte
	// Terminal is the terminal to publish. Required.
	Terminal *TerminalPublication
}

// CompleteCreationRequest completes a reserved Actor. Its fields repeat the
// reservation, as CommitRequest's do.
type CompleteCreationRequest struct {
	// Key is the reserved Actor's key (Kind ObjectActor).
	Key ObjectKey
	// ReservationID is ReserveResult.ReservationID: non-empty UTF-8 text
	// without NUL; another one is stale.
	ReservationID string
	// ExpectedStoreVersion is ReserveResult.Creating.StoreVersion.
	ExpectedStoreVersion StoreVersion
	// Target is the reservation's target (ReserveRequest.Target).
	Target CreationTarget
	// Completion is the creation's outcome and the terminal to publish.
	Completion Completion
}

// AbortRequest abandons a reservation: the reserved row is deleted and its
// capacity released. Its fields repeat the reservation.
type AbortRequest struct {
	// Key is the reserved object's key (any object kind).
	Key ObjectKey
	// ReservationID is ReserveResult.ReservationID; another one is stale.
	ReservationID string
	// ExpectedStoreVersion is ReserveResult.Creating.StoreVersion.
	ExpectedStoreVersion StoreVersion
	// Target is the reservation's target (ReserveRequest.Target).
	Target CreationTarget
}

// AggregateParticipant is one row of an aggregate.
type AggregateParticipant struct {
	// AuthorityKey is the row's key (EncodeKey of an active row): non-empty
	// UTF-8 text without NUL.
	AuthorityKey Key
	// ExpectedStoreVersion is the row's version the caller read; the
	// aggregate applies only while the row is still at it.
	ExpectedStoreVersion StoreVersion
	// OwnerTransition is TransitionPreserve (the row stays with its owner,
	// which must be live) or TransitionNewOwner (it moves to the aggregate's
	// target owner and node, whatever its current owner's liveness).
	OwnerTransition GenerationTransition
	// AuthorityPayload is the row's payload after the commit: at most
	// MaxPayloadBytes.
	AuthorityPayload []byte
	// MembershipMutation is the caller's record of the membership change
	// this row takes part in (for example the group it joins), kept with the
	// aggregate record and part of the request's identity (Equal); opaque
	// to the store, bounded only by the server's request size.
	MembershipMutation []byte
}

// AggregatePrepareRequest prepares an aggregate: a set of rows that commit
// together, the newOwner ones moving to the target owner and node.
type AggregatePrepareRequest struct {
	// AggregateID names the aggregate (the caller's move or group
	// operation): non-empty UTF-8 text without NUL.
	AggregateID string
	// AggregateGeneration is the attempt of that aggregate: ≥ 1. A retried
	// prepare repeats it; a new attempt of the same ID takes another one.
	AggregateGeneration int64
	// TargetOwner is the lease the newOwner participants move to (its
	// OwnerID non-empty); it must be live on the target node.
	TargetOwner OwnerToken
	// TargetDescriptor is the node they move to (mesh and RID non-empty).
	TargetDescriptor NodeDescriptor
	// TargetDescriptorLifecycleGeneration is that node's lifecycle
	// generation: the newOwner participants move onto it, also from another
	// lifecycle of the same node.
	TargetDescriptorLifecycleGeneration int64
	// Capacity is what the aggregate takes on the target node: valid as
	// ValidateCapacityVector says, and equal to the sum of the newOwner
	// participants' current capacities (otherwise the prepare is a
	// conflict).
	Capacity CapacityVector
	// InventoryDigest is the caller's digest of what the aggregate moves
	// (for example SHA-256 of its inventory): exactly 32 bytes, opaque to
	// the store, part of the request's identity.
	InventoryDigest []byte
	// Participants are the rows the aggregate commits together: at least
	// one, unique and sorted by AuthorityKey (byte order).
	Participants []AggregateParticipant
}

// Clone returns a deep copy.
func (r *AggregatePrepareRequest) Clone() *AggregatePrepareRequest {
	c := *r
	c.Capacity = r.Capacity.Clone()
	c.InventoryDigest = bytes.Clone(r.InventoryDigest)
	c.Participants = make([]AggregateParticipant, len(r.Participants))
	for i, p := range r.Participants {
		p.AuthorityPayload = bytes.Clone(p.AuthorityPayload)
		p.MembershipMutation = bytes.Clone(p.MembershipMutation)
		c.Participants[i] = p
	}
	return &c
}

// Equal reports whether two prepare requests are the same request.
func (r *AggregatePrepareRequest) Equal(o *AggregatePrepareRequest) bool {
	if r.AggregateID != o.AggregateID ||
		r.AggregateGeneration != o.AggregateGeneration ||
		r.TargetOwner != o.TargetOwner ||
		!bytes.Equal(r.InventoryDigest, o.InventoryDigest) ||
		len(r.Participants) != len(o.Participants) ||
		r.TargetDescriptor != o.TargetDescriptor ||
		r.TargetDescriptorLifecycleGeneration != o.TargetDescriptorLifecycleGeneration ||
		!r.Capacity.Equal(o.Capacity) {
		return false
	}
	for i, p := range r.Participants {
		q := o.Participants[i]
		if p.AuthorityKey != q.AuthorityKey ||
			p.ExpectedStoreVersion != q.ExpectedStoreVersion ||
			p.OwnerTransition != q.OwnerTransition ||
			!bytes.Equal(p.AuthorityPayload, q.AuthorityPayload) ||
			!bytes.Equal(p.MembershipMutation, q.MembershipMutation) {
			return false
		}
	}
	return true
}

// Fence identifies a prepared aggregate: PrepareAggregateResult.Fence, or
// the prepare request's Fence().
type Fence struct {
	// AggregateID is the request's AggregateID: non-empty UTF-8 text
	// without NUL.
	AggregateID string
	// AggregateGeneration is the request's AggregateGeneration: ≥ 1.
	AggregateGeneration int64
}

// TargetAllocation is the active allocation the aggregate's capacity takes on
// its target node.
func (r *AggregatePrepareRequest) TargetAllocation() PlacementAllocation {
	a := PlacementAllocation{
		State:                         AllocationActive,
		ObjectKind:                    ObjectActor,
		Descriptor:                    r.TargetDescriptor,
		DescriptorLifecycleGeneration: r.TargetDescriptorLifecycleGeneration,
		Capacity:                      r.Capacity.Clone(),
	}
	if r.Capacity.SpotType != nil {
		a.ObjectKind = r.Capacity.SpotType.ObjectKind
		a.StableType = r.Capacity.SpotType.StableType
	}
	return a
}

// Fence returns the fence of this request.
func (r *AggregatePrepareRequest) Fence() Fence {
	return Fence{AggregateID: r.AggregateID, AggregateGeneration: r.AggregateGeneration}
}
