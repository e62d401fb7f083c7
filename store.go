package authority

import (
	"context"
	"time"
)

// AuthorityStore reads and rewrites existing authority rows.
type AuthorityStore interface {
	// ReadAuthority returns the row at key (KindSnapshot) or KindMissing.
	ReadAuthority(ctx context.Context, key Key) (ReadResult, error)
	// CompareExchangeAuthority applies m to the active row at key when its
	// version is expected. Put and delete need the row's owner to be live;
	// rebindOwnerLease needs the target lease to be live; restore only needs
	// the expected owner to match.
	CompareExchangeAuthority(ctx context.Context, key Key, expected StoreVersion, m Mutation) (CompareExchangeResult, error)
	// ListAuthorities lists the rows whose key starts with prefix, in key
	// order, limit (1..MaxScanLimit) at a time. An empty cursor starts the
	// listing; a page's NextCursor continues it. A listing is a consistent
	// snapshot, or ends with KindScanExpired: it is never torn.
	ListAuthorities(ctx context.Context, prefix string, cursor ScanCursor, limit int) (ScanResult, error)
	// RemoveAllByOwner deletes every row (active or reserved) held by owner
	// and releases its capacity, returning how many rows it removed.
	RemoveAllByOwner(ctx context.Context, owner OwnerToken) (int64, error)
}

// ObjectCreationStore creates objects: reserve, then commit (Spots) or
// completeCreation (Actors), or abort.
type ObjectCreationStore interface {
	// Reserve creates a reserved row for a new object on a live target with
	// placement capacity. Only one reservation of a key can exist.
	Reserve(ctx context.Context, req ReserveRequest) (ReserveResult, error)
	// Commit turns a reserved Spot into an active one. Re-committing a
	// committed reservation reports KindAlreadyCommitted.
	Commit(ctx context.Context, req CommitRequest) (CommitResult, error)
	// CompleteCreation finishes a reserved Actor (created, rejected or
	// failed) and publishes its creation terminal.
	CompleteCreation(ctx context.Context, req CompleteCreationRequest) (CompleteCreationResult, error)
	// ReadCreationTerminal returns the unexpired terminal of an operation.
	ReadCreationTerminal(ctx context.Context, op CreationOperation) (TerminalReadResult, error)
	// Abort deletes a reserved row and releases its capacity. Re-aborting an
	// aborted reservation reports KindAlreadyAborted.
	Abort(ctx context.Context, req AbortRequest) (AbortResult, error)
}

// AggregateStore moves groups of rows atomically.
type AggregateStore interface {
	// PrepareAggregate checks the participants and reserves the target's
	// capacity. Preparing the same request again reports KindAlreadyPrepared.
	PrepareAggregate(ctx context.Context, req AggregatePrepareRequest) (PrepareAggregateResult, error)
	// CommitAggregate applies every participant or none.
	CommitAggregate(ctx context.Context, fence Fence) (CommitAggregateResult, error)
	// AbortAggregate releases a prepared aggregate's capacity.
	AbortAggregate(ctx context.Context, fence Fence) (AbortAggregateResult, error)
}

// CapacityReader reports capacity accounting.
type CapacityReader interface {
	// CapacityUsage returns the active and reserved counts of one counter:
	// for ObjectActor the actor counter; for a Spot kind the counter of that
	// kind and stableType; for any other kind the node's total Spot counter.
	CapacityUsage(ctx context.Context, node NodeDescriptor, lifecycleGeneration int64, objectKind ObjectKind, stableType string) (CapacityUsage, error)
}

// Store is the whole provider contract.
type Store interface {
	AuthorityStore
	ObjectCreationStore
	AggregateStore
	CapacityReader
}

// ChangeWaiter is an optional capability: a change feed on single rows.
type ChangeWaiter interface {
	// WaitForChange returns once the row at key is no longer at version seen
	// (the zero StoreVersion meaning "absent"), or when ctx ends. It returns
	// immediately if the row already changed. No change after the call
	// begins is missed.
	WaitForChange(ctx context.Context, key Key, seen StoreVersion) error
}

// LivenessOracle tells the store whether an owner lease is live on a node.
type LivenessOracle interface {
	// IsTargetLive reports whether owner is live on the node at that
	// lifecycle generation.
	IsTargetLive(node NodeDescriptor, lifecycleGeneration int64, owner OwnerToken) bool
}

// CapacityPolicy decides whether a placement fits next to what its node
// already holds. Without a policy every placement fits.
type CapacityPolicy interface {
	// PlacementCapacityAvailable reports whether requested fits next to what
	// the node already has reserved and active, per counter of requested.
	PlacementCapacityAvailable(node NodeDescriptor, requested, currentReserved, currentActive CapacityVector) bool
}

// IdentityClaims names the keys claimed elsewhere: they cannot be reserved.
type IdentityClaims interface {
	// IdentityClaimed reports whether key is claimed.
	IdentityClaimed(key Key) bool
}

// Clock is the store's clock.
type Clock interface {
	Now() time.Time
}

// SystemClock is the wall clock.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// RelocationStore keeps short-lived blobs (for example an Instance
// activation's recovery envelope) outside the authority rows.
type RelocationStore interface {
	// PutNew stores data under a new reference that expires after retention.
	PutNew(ctx context.Context, data []byte, retention time.Duration) (BlobReceipt, error)
	// Read returns the blob (KindFound) or KindMissing once deleted or expired.
	Read(ctx context.Context, ref BlobReference) (BlobReadResult, error)
	// Delete removes the blob; deleting a missing blob is not an error.
	Delete(ctx context.Context, ref BlobReference) error
}

// BlobReference names a relocation blob.
type BlobReference string

// BlobReceipt is the result of RelocationStore.PutNew.
type BlobReceipt struct {
	Reference BlobReference
	ExpiresAt time.Time
	StoreNow  time.Time
}

// BlobReadResult is a blob read: KindFound with Bytes, or KindMissing.
type BlobReadResult struct {
	Kind  ResultKind
	Bytes []byte
}
