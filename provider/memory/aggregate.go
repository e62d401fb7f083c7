package memory

import (
	"bytes"
	"context"
	"time"

	authority "github.com/zlink-systems/authority"
)

// aggregateState is the state of an aggregate record.
type aggregateState uint8

const (
	aggregatePrepared aggregateState = iota
	aggregateCommitted
	aggregateAborted
)

// aggregateRecord is a prepared, committed or aborted aggregate.
type aggregateRecord struct {
	request *authority.AggregatePrepareRequest
	state   aggregateState
	// deadline is when a committed or aborted record is swept.
	deadline time.Time
}

// prepareAggregate checks the participants and reserves the target's
// capacity.
func (s *Store) prepareAggregate(ctx context.Context, req authority.AggregatePrepareRequest) (authority.PrepareAggregateResult, error) {
	if err := authority.ValidateAggregatePrepare(req); err != nil {
		return authority.PrepareAggregateResult{}, err
	}
	if _, err := s.beginWrite(ctx); err != nil {
		return authority.PrepareAggregateResult{}, err
	}
	defer s.mu.Unlock()
	conflict := authority.PrepareAggregateResult{Kind: authority.KindConflict}
	fence := req.Fence()
	if existing := s.aggregates[fence]; existing != nil {
		switch {
		case existing.state == aggregatePrepared && existing.request.Equal(&req):
			return authority.PrepareAggregateResult{Kind: authority.KindAlreadyPrepared, Fence: fence}, nil
		case existing.state == aggregateCommitted:
			return authority.PrepareAggregateResult{Kind: authority.KindStale}, nil
		default:
			return conflict, nil
		}
	}
	if !s.liveness.IsTargetLive(req.TargetDescriptor, req.TargetDescriptorLifecycleGeneration, req.TargetOwner) {
		return conflict, nil
	}
	target := req.TargetAllocation()
	if !s.hasPendingCapacity(&target) {
		return conflict, nil
	}
	var source authority.CapacityVector
	for _, p := range req.Participants {
		r := s.row(p.AuthorityKey)
		if r == nil || r.snap.Allocation.State != authority.AllocationActive || !r.versionIs(p.ExpectedStoreVersion) {
			return conflict, nil
		}
		if p.OwnerTransition == authority.TransitionPreserve {
			if !s.isOwnerLive(&r.snap) {
				return conflict, nil
			}
			continue
		}
		var err error
		if source, err = authority.AddCapacity(source, r.snap.Allocation.Capacity); err != nil {
			return authority.PrepareAggregateResult{}, err
		}
	}
	if !source.Equal(req.Capacity) {
		return conflict, nil
	}
	s.adjust(countPending, s.cellEntries(target), 1)
	s.aggregates[fence] = &aggregateRecord{request: req.Clone(), state: aggregatePrepared}
	return authority.PrepareAggregateResult{Kind: authority.KindPrepared, Fence: fence}, nil
}

// commitAggregate applies every participant of a prepared aggregate or
// none.
func (s *Store) commitAggregate(ctx context.Context, fence authority.Fence) (authority.CommitAggregateResult, error) {
	if err := authority.ValidateFence(fence); err != nil {
		return authority.CommitAggregateResult{}, err
	}
	now, err := s.beginWrite(ctx)
	if err != nil {
		return authority.CommitAggregateResult{}, err
	}
	defer s.mu.Unlock()
	stale := authority.CommitAggregateResult{Kind: authority.KindStale}
	a := s.aggregates[fence]
	switch {
	case a == nil:
		return stale, nil
	case a.state == aggregateCommitted:
		return authority.CommitAggregateResult{Kind: authority.KindAlreadyCommitted}, nil
	case a.state != aggregatePrepared:
		return stale, nil
	}
	req := a.request
	rows := make([]*row, len(req.Participants))
	var owners int64
	for i, p := range req.Participants {
		r := s.row(p.AuthorityKey)
		if r == nil || r.snap.Allocation.State != authority.AllocationActive || !r.versionIs(p.ExpectedStoreVersion) {
			return stale, nil
		}
		if p.OwnerTransition == authority.TransitionNewOwner {
			if !s.liveness.IsTargetLive(req.TargetDescriptor, req.TargetDescriptorLifecycleGeneration, req.TargetOwner) {
				return stale, nil
			}
			owners++
		} else if !s.isOwnerLive(&r.snap) {
			return stale, nil
		}
		rows[i] = r
	}
	if s.storeVersion > authority.MaxGeneration-int64(len(rows)) ||
		s.ownerGeneration > authority.MaxGeneration-owners {
		return authority.CommitAggregateResult{Kind: authority.KindGenerationExhausted}, nil
	}
	tokens := make(map[authority.Key]int64, owners)
	for i, p := range req.Participants {
		r := rows[i]
		s.storeVersion++
		next := r.successor()
		next.version = s.storeVersion
		next.snap.Payload = bytes.Clone(p.AuthorityPayload)
		if p.OwnerTransition == authority.TransitionNewOwner {
			s.adjust(countActive, r.meta.entries(), -1)
			s.ownerGeneration++
			next.snap.AuthorityOwnerGeneration = s.ownerGeneration
			if r.snap.Owner() != req.TargetOwner {
				next.snap.OwnershipToken = next.version // a new owner or owner lease
			} // else the row's owner already: it keeps its token
			tokens[p.AuthorityKey] = next.snap.OwnershipToken
			next.snap.OwnerID = req.TargetOwner.OwnerID
			next.snap.OwnerLeaseGeneration = req.TargetOwner.LeaseGeneration
			alloc := next.snap.Allocation
			alloc.Descriptor = req.TargetDescriptor
			alloc.DescriptorLifecycleGeneration = req.TargetDescriptorLifecycleGeneration
			s.setAllocation(next, alloc)
		}
		s.putRow(next)
	}
	target := s.cellEntries(req.TargetAllocation())
	s.adjust(countPending, target, -1)
	s.adjust(countActive, target, 1)
	s.finishAggregate(fence, a, aggregateCommitted, now)
	return authority.CommitAggregateResult{Kind: authority.KindCommitted, OwnershipTokens: tokens}, nil
}

// abortAggregate releases a prepared aggregate's capacity.
func (s *Store) abortAggregate(ctx context.Context, fence authority.Fence) (authority.AbortAggregateResult, error) {
	if err := authority.ValidateFence(fence); err != nil {
		return authority.AbortAggregateResult{}, err
	}
	now, err := s.beginWrite(ctx)
	if err != nil {
		return authority.AbortAggregateResult{}, err
	}
	defer s.mu.Unlock()
	stale := authority.AbortAggregateResult{Kind: authority.KindStale}
	a := s.aggregates[fence]
	switch {
	case a == nil:
		return stale, nil
	case a.state == aggregateAborted:
		return authority.AbortAggregateResult{Kind: authority.KindAlreadyAborted}, nil
	case a.state != aggregatePrepared:
		return stale, nil
	}
	s.adjust(countPending, s.cellEntries(a.request.TargetAllocation()), -1)
	s.finishAggregate(fence, a, aggregateAborted, now)
	return authority.AbortAggregateResult{Kind: authority.KindAborted}, nil
}
