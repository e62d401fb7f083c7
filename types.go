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
type OwnerToken struct {
	OwnerID         string
	LeaseGeneration int64
}

// NodeDescriptor names a cluster node: its mesh and its RID.
type NodeDescriptor struct {
	MeshName string
	RID      string
}

// SpotTypeCapacity is the per-Spot-type part of a capacity vector.
type SpotTypeCapacity struct {
	ObjectKind ObjectKind
	StableType string
	Count      int64
}

// CapacityVector is the placement capacity an object consumes on its node.
type CapacityVector struct {
	Actors   int64
	Spots    int64
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

// Equal reports whether two vectors are the same (the seed's sameCapacity).
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
	Allocation               PlacementAllocation
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

// CreationIntent describes the creation request a reservation carries.
type CreationIntent struct {
	StableType              string
	RequestContentReference string
	RequestSHA256           []byte
	RequestEncodedSize      int64
}

// CreationTarget is the node and owner a reservation places an object on.
type CreationTarget struct {
	MeshName                string
	NodeRID                 string
	NodeLifecycleGeneration int64
	Owner                   OwnerToken
}

// Descriptor returns the target's node descriptor.
func (t CreationTarget) Descriptor() NodeDescriptor {
	return NodeDescriptor{MeshName: t.MeshName, RID: t.NodeRID}
}

// CreationOperationID is the 128-bit operation ID of a creation operation.
type CreationOperationID struct {
	High uint64
	Low  uint64
}

// CreationOperation identifies one creation operation of a source node.
type CreationOperation struct {
	SourceNodeRID        string
	SourceNodeGeneration int64
	OperationID          CreationOperationID
}

// TerminalPublication is the terminal a completeCreation publishes.
type TerminalPublication struct {
	Operation              CreationOperation
	TerminalEnvelope       []byte
	TerminalEnvelopeSHA256 []byte
	OperationDeadline      time.Time
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
type Mutation struct {
	Kind MutationKind
	// Payload is the new payload (put, rebindOwnerLease, restore).
	Payload []byte
	// GenerationTransition must be TransitionPreserve for a put.
	GenerationTransition GenerationTransition
	// ExpectedOwner is the row's current owner (rebindOwnerLease, restore).
	ExpectedOwner OwnerToken
	// TargetOwner is the owner's new lease (rebindOwnerLease).
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
	Key             ObjectKey
	Intent          CreationIntent
	Target          CreationTarget
	CreatingPayload []byte
	Capacity        CapacityVector
}

// CommitRequest commits a reserved non-Actor object.
type CommitRequest struct {
	Key                  ObjectKey
	ReservationID        string
	ExpectedStoreVersion StoreVersion
	Target               CreationTarget
	ReadyPayload         []byte
}

// CompletionKind is the outcome a completeCreation reports.
type CompletionKind = TerminalState

// Completion is the outcome of an Actor creation.
type Completion struct {
	Kind CompletionKind
	// ReadyPayload is the ready payload (created only).
	ReadyPayload []byte
	// Terminal is the terminal to publish. Required.
	Terminal *TerminalPublication
}

// CompleteCreationRequest completes a reserved Actor.
type CompleteCreationRequest struct {
	Key                  ObjectKey
	ReservationID        string
	ExpectedStoreVersion StoreVersion
	Target               CreationTarget
	Completion           Completion
}

// AbortRequest abandons a reservation.
type AbortRequest struct {
	Key                  ObjectKey
	ReservationID        string
	ExpectedStoreVersion StoreVersion
	Target               CreationTarget
}

// AggregateParticipant is one row of an aggregate.
type AggregateParticipant struct {
	AuthorityKey         Key
	ExpectedStoreVersion StoreVersion
	OwnerTransition      GenerationTransition
	AuthorityPayload     []byte
	MembershipMutation   []byte
}

// AggregatePrepareRequest prepares an aggregate: a set of rows that commit
// together, the newOwner ones moving to the target owner and node.
type AggregatePrepareRequest struct {
	AggregateID                         string
	AggregateGeneration                 int64
	TargetOwner                         OwnerToken
	TargetDescriptor                    NodeDescriptor
	TargetDescriptorLifecycleGeneration int64
	Capacity                            CapacityVector
	InventoryDigest                     []byte
	// Participants must be unique and sorted by AuthorityKey.
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

// Equal reports whether two prepare requests are the same request (the seed's
// sameAggregateRequest).
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

// Fence identifies a prepared aggregate.
type Fence struct {
	AggregateID         string
	AggregateGeneration int64
}

// TargetAllocation is the active allocation the aggregate's capacity takes on
// its target node (the seed's aggregateTargetAllocation).
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
