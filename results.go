package authority

import "time"

// ResultKind names the outcome of an operation (docs/glossary.md maps the
// names to the TypeScript reference's).
type ResultKind string

// Outcome kinds. Each result type documents which of them it can carry.
const (
	KindConflict                   ResultKind = "conflict"
	KindAlreadyExists              ResultKind = "alreadyExists"
	KindTypeMismatch               ResultKind = "typeMismatch"
	KindPlacementCapacityExhausted ResultKind = "placementCapacityExhausted"
	KindGenerationExhausted        ResultKind = "generationExhausted"
	KindReserved                   ResultKind = "reserved"
	KindCommitted                  ResultKind = "committed"
	KindAlreadyCommitted           ResultKind = "alreadyCommitted"
	KindStale                      ResultKind = "stale"
	KindCreated                    ResultKind = "created"
	KindRejected                   ResultKind = "rejected"
	KindFailed                     ResultKind = "failed"
	KindAlreadyCompleted           ResultKind = "alreadyCompleted"
	KindAborted                    ResultKind = "aborted"
	KindAlreadyAborted             ResultKind = "alreadyAborted"
	KindPrepared                   ResultKind = "prepared"
	KindAlreadyPrepared            ResultKind = "alreadyPrepared"
	KindScanExpired                ResultKind = "scanExpired"
	KindPage                       ResultKind = "page"
	KindMissing                    ResultKind = "missing"
	KindSnapshot                   ResultKind = "snapshot"
	KindStored                     ResultKind = "stored"
	KindDeleted                    ResultKind = "deleted"
	KindFound                      ResultKind = "found"
)

// ReadResult is a row read: KindMissing or KindSnapshot.
type ReadResult struct {
	Kind ResultKind
	// Snapshot is set for KindSnapshot.
	Snapshot *Snapshot
	// StoreNow is the store's clock at the read.
	StoreNow time.Time
}

// Missing returns a KindMissing read at now.
func Missing(now time.Time) ReadResult { return ReadResult{Kind: KindMissing, StoreNow: now} }

// Found returns a KindSnapshot read of s.
func Found(s *Snapshot) ReadResult {
	return ReadResult{Kind: KindSnapshot, Snapshot: s, StoreNow: s.StoreNow}
}

// CompareExchangeResult is the outcome of CompareExchangeAuthority:
// KindStored, KindDeleted, KindConflict or KindGenerationExhausted.
type CompareExchangeResult struct {
	Kind ResultKind
	// Snapshot is the stored row (KindStored).
	Snapshot *Snapshot
	// StoreVersion is the version of the delete (KindDeleted).
	StoreVersion StoreVersion
	// StoreNow is the store's clock (KindDeleted, KindStored).
	StoreNow time.Time
	// Current is the row as it is (KindConflict).
	Current ReadResult
}

// ScanResult is a listing page (KindPage) or KindScanExpired.
type ScanResult struct {
	Kind  ResultKind
	Items []ScanItem
	// NextCursor continues the listing; empty on the last page.
	NextCursor ScanCursor
}

// ReserveResult is the outcome of Reserve: KindReserved, KindAlreadyExists,
// KindTypeMismatch, KindConflict, KindPlacementCapacityExhausted or
// KindGenerationExhausted. None of them is an error (err is nil); nothing is
// written unless Kind is KindReserved.
//
// KindConflict (as in the seed) is one of:
//   - the row is being reserved by another creation: Current is that row
//     (KindFound, its Allocation.State reserved);
//   - the target owner is not live on the target node lifecycle — its lease
//     was lost, expired, closed or never acquired, or it is live on another
//     node or lifecycle generation than Target names: Current is KindMissing
//     (a reserve by a lease that is no longer live). Retrying with the same
//     Target cannot succeed; acquire a new lease generation and reserve with
//     its token (on etcd: OwnerLease.Done is closed);
//   - the key's identity is claimed (IdentityClaims): Current is KindMissing.
type ReserveResult struct {
	Kind ResultKind
	// ReservationID and Creating are set for KindReserved.
	ReservationID string
	Creating      *Snapshot
	// Current is the row in the way (KindAlreadyExists, KindTypeMismatch,
	// KindConflict; for the latter KindMissing when the target owner is not
	// live or the identity is claimed, see above).
	Current ReadResult
}

// CommitResult is the outcome of Commit: KindCommitted, KindAlreadyCommitted,
// KindStale or KindGenerationExhausted.
type CommitResult struct {
	Kind ResultKind
	// Ready is the active row (KindCommitted, KindAlreadyCommitted).
	Ready *Snapshot
}

// CompleteCreationResult is the outcome of CompleteCreation: KindCreated,
// KindRejected, KindFailed, KindAlreadyCompleted, KindStale or
// KindGenerationExhausted.
type CompleteCreationResult struct {
	Kind ResultKind
	// Ready is the active row (KindCreated).
	Ready *Snapshot
	// Terminal is the published terminal (KindCreated, KindRejected,
	// KindFailed, KindAlreadyCompleted).
	Terminal *TerminalRecord
}

// TerminalReadResult is the outcome of ReadCreationTerminal: KindFound or
// KindMissing.
type TerminalReadResult struct {
	Kind   ResultKind
	Record *TerminalRecord
	// StoreNow is the store's clock (KindMissing).
	StoreNow time.Time
}

// AbortResult is the outcome of Abort: KindAborted, KindAlreadyAborted or
// KindStale.
type AbortResult struct {
	Kind ResultKind
}

// PrepareAggregateResult is the outcome of PrepareAggregate: KindPrepared,
// KindAlreadyPrepared, KindConflict or KindStale.
type PrepareAggregateResult struct {
	Kind ResultKind
	// Fence is set for KindPrepared and KindAlreadyPrepared.
	Fence Fence
}

// CommitAggregateResult is the outcome of CommitAggregate: KindCommitted,
// KindAlreadyCommitted, KindStale or KindGenerationExhausted.
type CommitAggregateResult struct {
	Kind ResultKind
	// OwnershipTokens holds, for KindCommitted, the ownership token
	// (Snapshot.OwnershipToken) of every participant the commit gave to the
	// target owner (TransitionNewOwner), by key: the tokens the target owner
	// fences its effects with. The token changes exactly when the owner ID
	// or the lease generation changes, so a participant that was the
	// target's already (same owner ID and lease generation) is listed with
	// its unchanged token. Preserve participants kept their owner and token
	// and are not listed. Nil for every other kind: after
	// KindAlreadyCommitted (a retried commit), read the rows.
	OwnershipTokens map[Key]int64
}

// AbortAggregateResult is the outcome of AbortAggregate: KindAborted,
// KindAlreadyAborted or KindStale.
type AbortAggregateResult struct {
	Kind ResultKind
}
