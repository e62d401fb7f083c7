package memory

import (
	"context"

	authority "github.com/zlink-systems/authority"
)

// readAuthority returns the row at key.
func (s *Store) readAuthority(ctx context.Context, key authority.Key) (authority.ReadResult, error) {
	if err := authority.ValidateKey(key); err != nil {
		return authority.ReadResult{}, err
	}
	now, err := s.lock(ctx)
	if err != nil {
		return authority.ReadResult{}, err
	}
	// Rows may be rewritten in place: copy under the lock.
	result := s.read(key, now)
	s.mu.Unlock()
	return result, nil
}

// compareExchangeAuthority applies m to the active row at key when its
// version is expected.
func (s *Store) compareExchangeAuthority(ctx context.Context, key authority.Key, expected authority.StoreVersion, m authority.Mutation) (authority.CompareExchangeResult, error) {
	if err := authority.ValidateCompareExchange(key, m); err != nil {
		return authority.CompareExchangeResult{}, err
	}
	now, err := s.beginWrite(ctx)
	if err != nil {
		return authority.CompareExchangeResult{}, err
	}
	defer s.mu.Unlock()
	conflict := func() (authority.CompareExchangeResult, error) {
		return authority.CompareExchangeResult{Kind: authority.KindConflict, Current: s.read(key, now)}, nil
	}
	exhausted := authority.CompareExchangeResult{Kind: authority.KindGenerationExhausted}
	r := s.row(key)
	if r == nil || r.snap.Allocation.State != authority.AllocationActive || !r.versionIs(expected) {
		return conflict()
	}
	switch m.Kind {
	case authority.MutationDelete:
		if !s.isOwnerLive(&r.snap) {
			return conflict()
		}
		v, ok := s.nextStoreVersion()
		if !ok {
			return exhausted, nil
		}
		s.adjust(countActive, r.meta.entries(), -1)
		s.deleteRow(r)
		return authority.CompareExchangeResult{Kind: authority.KindDeleted, StoreVersion: version(v), StoreNow: now}, nil
	case authority.MutationRebindOwnerLease:
		owner := r.snap.Owner()
		if m.ExpectedOwner != owner ||
			m.TargetOwner.OwnerID != owner.OwnerID ||
			m.TargetOwner.LeaseGeneration == owner.LeaseGeneration ||
			!s.liveness.IsTargetLive(r.snap.Allocation.Descriptor, r.snap.Allocation.DescriptorLifecycleGeneration, m.TargetOwner) {
			return conflict()
		}
	case authority.MutationRestore:
		if m.ExpectedOwner != r.snap.Owner() {
			return conflict()
		}
	default: // put: ValidateMutation admits no other kind
		if !s.isOwnerLive(&r.snap) {
			return conflict()
		}
	}
	v, ok := s.nextStoreVersion()
	if !ok {
		return exhausted, nil
	}
	next, inPlace := s.next(r)
	next.version = v
	next.snap.Payload = payloadCopy(r.snap.Payload, m.Payload, inPlace)
	if m.Kind == authority.MutationRebindOwnerLease {
		next.snap.OwnerLeaseGeneration = m.TargetOwner.LeaseGeneration
		next.snap.OwnershipToken = v // a new owner lease
	}
	s.storeNext(next, inPlace)
	return authority.CompareExchangeResult{Kind: authority.KindStored, Snapshot: next.snapshot(now), StoreNow: now}, nil
}

// removeAllByOwner deletes every row held by owner, active or reserved, and
// releases its capacity. It visits every row.
func (s *Store) removeAllByOwner(ctx context.Context, owner authority.OwnerToken) (int64, error) {
	if err := authority.ValidateOwner(owner); err != nil {
		return 0, err
	}
	if _, err := s.beginWrite(ctx); err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	var held []*row
	s.index.Scan(func(r *row) bool {
		if r.snap.OwnerID == owner.OwnerID && r.snap.OwnerLeaseGeneration == owner.LeaseGeneration {
			held = append(held, r)
		}
		return true
	})
	for _, r := range held {
		if r.snap.Allocation.State == authority.AllocationActive {
			s.adjust(countActive, r.meta.entries(), -1)
		} else {
			s.adjust(countPending, r.meta.entries(), -1)
			s.reservations.drop(r.meta.reservation.creation.seq)
		}
		s.deleteRow(r)
	}
	return int64(len(held)), nil
}
