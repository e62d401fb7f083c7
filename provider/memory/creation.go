package memory

import (
	"bytes"
	"context"
	"time"
	"unsafe"

	authority "github.com/zlink-systems/authority"
)

// reservationState is a reservation terminal: how a reservation ended.
type reservationState uint8

const (
	reservationCommitted reservationState = iota + 1
	reservationRejected
	reservationFailed
	reservationAborted
)

// reservationTerminal is a retained reservation outcome. It holds no
// pointer, so that the collector does not scan the map of them.
type reservationTerminal struct {
	state reservationState
	// deadline is the deadline of the sweep entry made with it.
	deadline time.Duration
}

// reservationTerminal returns the retained outcome of a reservation.
func (s *Store) reservationTerminal(reservationID string) (reservationTerminal, bool) {
	id, ok := parseReservationID(reservationID)
	if !ok {
		return reservationTerminal{}, false
	}
	return s.reservations.terminal(id)
}

// endReservation records how the reservation of r ended.
func (s *Store) endReservation(r *row, state reservationState, now time.Time) {
	s.setReservationTerminal(r.meta.reservation.creation.seq, state, now)
}

// reserve creates a reserved row for a new object.
func (s *Store) reserve(ctx context.Context, req authority.ReserveRequest) (authority.ReserveResult, error) {
	key, err := authority.ValidateReserve(req)
	if err != nil {
		return authority.ReserveResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return authority.ReserveResult{}, err
	}
	nr := newReservedRow(key, req)
	now, err := s.beginWrite(ctx)
	if err != nil {
		return authority.ReserveResult{}, err
	}
	defer s.mu.Unlock()
	if refused, ok := s.reserveRefused(key, req, &nr.alloc, now); ok {
		return refused, nil
	}
	s.storeVersion++
	s.objectGeneration++
	s.ownerGeneration++
	r, m, p := &nr.b.row, &nr.b.meta, nr.p
	seq, lo := s.reservations.open(nr.hi)
	encodeIDLow(&p.idText, lo)
	r.version = s.storeVersion
	r.snap.ObjectGeneration = s.objectGeneration
	r.snap.AuthorityOwnerGeneration = s.ownerGeneration
	r.snap.OwnershipToken = r.version // a new owner
	p.creation = creation{seq: seq, reservationID: nr.id, target: req.Target}
	s.initAllocation(r, m, nr.alloc)
	s.putRow(r)
	s.adjust(countPending, m.entries(), 1)
	return authority.ReserveResult{Kind: authority.KindReserved, ReservationID: nr.id, Creating: r.snapshotIn(nr.room, now)}, nil
}

// unstoredReservation is a reserved row made before the store's lock is taken:
// what the new row and its copy need that does not depend on the store's
// state. One allocation for the row, its shared parts and (when it fits) the
// payload; one for the reservation, its ID and (when it fits) the request
// digest, which are garbage once the row is committed; one for the copy
// returned. When the row is not stored they are garbage.
type unstoredReservation struct {
	b     *rowBlock
	p     *reservationPart
	room  exportRoom
	hi    uint64 // the high half of the reservation ID
	id    string // the reservation ID (its low half is written when stored)
	alloc authority.PlacementAllocation
}

func newReservedRow(key authority.Key, req authority.ReserveRequest) unstoredReservation {
	nr := unstoredReservation{b: new(rowBlock), p: new(reservationPart),
		room: roomFor(true, len(req.CreatingPayload)+len(req.Intent.RequestSHA256))}
	target, r, m, p := req.Target, &nr.b.row, &nr.b.meta, nr.p
	m.reservation = p
	r.key = key
	r.snap = authority.Snapshot{
		OwnerID:              target.Owner.OwnerID,
		OwnerLeaseGeneration: target.Owner.LeaseGeneration,
	}
	// The payload's capacity runs to the end of the buffer: a rewrite in
	// place (commit) can reuse it.
	if c := req.CreatingPayload; c != nil && len(c) <= len(nr.b.inline) {
		r.snap.Payload = nr.b.inline[:copy(nr.b.inline[:], c)]
	} else if c != nil {
		r.snap.Payload = bytes.Clone(c)
	}
	nr.hi = reservationRandom()
	encodeIDHigh(&p.idText, nr.hi)
	// The ID's text is complete before the row is stored, and never
	// written again: a string can share it.
	nr.id = unsafe.String(&p.idText[0], len(p.idText))
	p.pending = authority.PendingCreation{
		ReservationID:           nr.id,
		RequestContentReference: req.Intent.RequestContentReference,
		RequestEncodedSize:      req.Intent.RequestEncodedSize,
	}
	if d := req.Intent.RequestSHA256; len(d) <= len(p.digest) {
		p.pending.RequestSHA256 = p.digest[:copy(p.digest[:], d):len(d)]
	} else {
		p.pending.RequestSHA256 = bytes.Clone(d)
	}
	r.snap.PendingCreation = &p.pending
	nr.alloc = authority.PlacementAllocation{
		State:                         authority.AllocationReserved,
		ObjectKind:                    req.Key.Kind,
		StableType:                    req.Intent.StableType,
		Descriptor:                    target.Descriptor(),
		DescriptorLifecycleGeneration: target.NodeLifecycleGeneration,
		Capacity:                      req.Capacity,
	}
	return nr
}

// reserveRefused runs the reservation's checks in the contract's order
// (under the lock) and returns the refusal, if any.
func (s *Store) reserveRefused(key authority.Key, req authority.ReserveRequest, alloc *authority.PlacementAllocation, now time.Time) (authority.ReserveResult, bool) {
	if s.claims != nil && s.claims.IdentityClaimed(key) {
		return authority.ReserveResult{Kind: authority.KindConflict, Current: authority.Missing(now)}, true
	}
	if current := s.row(key); current != nil {
		cur := &current.snap.Allocation
		switch {
		case cur.ObjectKind != req.Key.Kind || cur.StableType != req.Intent.StableType:
			return authority.ReserveResult{Kind: authority.KindTypeMismatch, Current: authority.Found(current.snapshot(now))}, true
		case cur.State == authority.AllocationActive:
			return authority.ReserveResult{Kind: authority.KindAlreadyExists, Current: authority.Found(current.snapshot(now))}, true
		default:
			return authority.ReserveResult{Kind: authority.KindConflict, Current: s.read(key, now)}, true
		}
	}
	if !s.isCreationTargetLive(req.Target) {
		return authority.ReserveResult{Kind: authority.KindConflict, Current: s.read(key, now)}, true
	}
	if !s.hasPendingCapacity(alloc) {
		return authority.ReserveResult{Kind: authority.KindPlacementCapacityExhausted}, true
	}
	if s.storeVersion >= authority.MaxGeneration ||
		s.objectGeneration >= authority.MaxGeneration ||
		s.ownerGeneration >= authority.MaxGeneration {
		return authority.ReserveResult{Kind: authority.KindGenerationExhausted}, true
	}
	return authority.ReserveResult{}, false
}

// reservedRow is the check commit, completeCreation and abort share: the
// reserved row at key made by this reservation, at this version, for this
// target; nil when any of that does not hold.
func (s *Store) reservedRow(key authority.Key, reservationID string, expected authority.StoreVersion, target authority.CreationTarget) *row {
	return reservedAt(s.row(key), reservationID, expected, target)
}

// reservedAt is reservedRow of the row r (nil when there is none).
func reservedAt(r *row, reservationID string, expected authority.StoreVersion, target authority.CreationTarget) *row {
	if r == nil ||
		r.snap.Allocation.State != authority.AllocationReserved ||
		r.meta.reservation.creation.reservationID != reservationID ||
		!r.versionIs(expected) ||
		r.meta.reservation.creation.target != target {
		return nil
	}
	return r
}

// activate stores the active row a reserved row becomes, moves its capacity
// from reserved to active and returns the new row.
func (s *Store) activate(r *row, v int64, payload []byte) *row {
	s.adjust(countPending, r.meta.entries(), -1)
	next, inPlace := s.next(r)
	next.version = v
	next.snap.Payload = payloadCopy(r.snap.Payload, payload, inPlace)
	next.snap.Allocation.State = authority.AllocationActive
	next.snap.PendingCreation = nil
	// A listing's copy of the reserved value keeps the part alive through
	// its PendingCreation; the row no longer needs it.
	next.meta.reservation = nil
	s.adjust(countActive, next.meta.entries(), 1)
	s.storeNext(next, inPlace)
	return next
}

// commit turns a reserved Spot into an active one.
func (s *Store) commit(ctx context.Context, req authority.CommitRequest) (authority.CommitResult, error) {
	key, err := authority.ValidateCommit(req)
	if err != nil {
		return authority.CommitResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return authority.CommitResult{}, err
	}
	// The copy returned is allocated before the lock is taken (Reserve).
	room := roomFor(false, len(req.ReadyPayload))
	now, err := s.beginWrite(ctx)
	if err != nil {
		return authority.CommitResult{}, err
	}
	defer s.mu.Unlock()
	current := s.row(key)
	if current != nil && current.snap.Allocation.State == authority.AllocationActive {
		if t, ok := s.reservationTerminal(req.ReservationID); ok && t.state == reservationCommitted {
			return authority.CommitResult{Kind: authority.KindAlreadyCommitted, Ready: current.snapshot(now)}, nil
		}
	}
	r := reservedAt(current, req.ReservationID, req.ExpectedStoreVersion, req.Target)
	if r == nil || !s.isCreationTargetLive(r.meta.reservation.creation.target) {
		return authority.CommitResult{Kind: authority.KindStale}, nil
	}
	v, ok := s.nextStoreVersion()
	if !ok {
		return authority.CommitResult{Kind: authority.KindGenerationExhausted}, nil
	}
	s.endReservation(r, reservationCommitted, now)
	ready := s.activate(r, v, req.ReadyPayload)
	return authority.CommitResult{Kind: authority.KindCommitted, Ready: ready.snapshotIn(room, now)}, nil
}

// completeCreation finishes a reserved Actor.
func (s *Store) completeCreation(ctx context.Context, req authority.CompleteCreationRequest) (authority.CompleteCreationResult, error) {
	if err := ctx.Err(); err != nil {
		return authority.CompleteCreationResult{}, err
	}
	// Validation hashes the envelope (up to 1 MiB): do it before locking,
	// against the clock read now; the expiry is checked again at the time
	// the completion takes effect (the lock may have been waited for).
	key, record, err := authority.ValidateCompleteCreation(req, s.clock.Now())
	if err != nil {
		return authority.CompleteCreationResult{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	if err := authority.ValidateTerminalExpiry(record.ExpiresAt, now); err != nil {
		return authority.CompleteCreationResult{}, err
	}
	record.StoreNow = now
	s.sweep(now)
	opKey := record.Operation.Key()
	if existing := s.operationTerminals[opKey]; existing != nil && existing.ExpiresAt.After(now) {
		return authority.CompleteCreationResult{Kind: authority.KindAlreadyCompleted, Terminal: existing.Clone()}, nil
	}
	if t, ok := s.reservationTerminal(req.ReservationID); ok && t.state != reservationAborted {
		// An expired terminal is gone (it may be swept; docs/deviations.md
		// M8).
		retained := s.operationTerminals[opKey]
		if retained == nil || !retained.ExpiresAt.After(now) {
			return authority.CompleteCreationResult{Kind: authority.KindStale}, nil
		}
		return authority.CompleteCreationResult{Kind: authority.KindAlreadyCompleted, Terminal: retained.Clone()}, nil
	}
	r := s.reservedRow(key, req.ReservationID, req.ExpectedStoreVersion, req.Target)
	if r == nil || !s.isCreationTargetLive(r.meta.reservation.creation.target) {
		return authority.CompleteCreationResult{Kind: authority.KindStale}, nil
	}
	if !s.creationTerminalAvailable(opKey, now) {
		return authority.CompleteCreationResult{Kind: authority.KindStale}, nil
	}
	v, ok := s.nextStoreVersion()
	if !ok {
		return authority.CompleteCreationResult{Kind: authority.KindGenerationExhausted}, nil
	}
	var result authority.CompleteCreationResult
	if req.Completion.Kind == authority.TerminalCreated {
		s.endReservation(r, reservationCommitted, now)
		ready := s.activate(r, v, req.Completion.ReadyPayload)
		result = authority.CompleteCreationResult{Kind: authority.KindCreated, Ready: ready.snapshot(now)}
	} else {
		s.adjust(countPending, r.meta.entries(), -1)
		s.deleteRow(r)
		state := reservationRejected
		if req.Completion.Kind == authority.TerminalFailed {
			state = reservationFailed
		}
		s.endReservation(r, state, now)
		result = authority.CompleteCreationResult{Kind: authority.ResultKind(req.Completion.Kind)}
	}
	s.setOperationTerminal(opKey, record)
	result.Terminal = record.Clone()
	return result, nil
}

// creationTerminalAvailable reports that no unexpired terminal of the
// operation exists (an expired one is dropped).
func (s *Store) creationTerminalAvailable(opKey string, now time.Time) bool {
	existing := s.operationTerminals[opKey]
	if existing == nil {
		return true
	}
	if !existing.ExpiresAt.After(now) {
		delete(s.operationTerminals, opKey)
		return true
	}
	return false
}

// readCreationTerminal returns the unexpired terminal of an operation.
func (s *Store) readCreationTerminal(ctx context.Context, op authority.CreationOperation) (authority.TerminalReadResult, error) {
	if err := authority.ValidateCreationOperation(op); err != nil {
		return authority.TerminalReadResult{}, err
	}
	key := op.Key()
	now, err := s.lock(ctx)
	if err != nil {
		return authority.TerminalReadResult{}, err
	}
	defer s.mu.Unlock()
	rec := s.operationTerminals[key]
	if rec == nil {
		return authority.TerminalReadResult{Kind: authority.KindMissing, StoreNow: now}, nil
	}
	if !rec.ExpiresAt.After(now) {
		delete(s.operationTerminals, key)
		return authority.TerminalReadResult{Kind: authority.KindMissing, StoreNow: now}, nil
	}
	return authority.TerminalReadResult{Kind: authority.KindFound, Record: rec.Clone(), StoreNow: now}, nil
}

// abort deletes a reserved row and releases its capacity.
func (s *Store) abort(ctx context.Context, req authority.AbortRequest) (authority.AbortResult, error) {
	key, err := authority.ValidateAbort(req)
	if err != nil {
		return authority.AbortResult{}, err
	}
	now, err := s.beginWrite(ctx)
	if err != nil {
		return authority.AbortResult{}, err
	}
	defer s.mu.Unlock()
	if t, ok := s.reservationTerminal(req.ReservationID); ok && t.state == reservationAborted {
		return authority.AbortResult{Kind: authority.KindAlreadyAborted}, nil
	}
	r := s.reservedRow(key, req.ReservationID, req.ExpectedStoreVersion, req.Target)
	if r == nil {
		return authority.AbortResult{Kind: authority.KindStale}, nil
	}
	s.adjust(countPending, r.meta.entries(), -1)
	s.deleteRow(r)
	s.endReservation(r, reservationAborted, now)
	return authority.AbortResult{Kind: authority.KindAborted}, nil
}
