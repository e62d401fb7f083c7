package memory

import (
	"context"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/internal/observe"
)

// The contract operations, each recorded by the store's observer (metrics,
// span, outcome) around the method that does the work.

// ReadAuthority reads the row at key (the work: readAuthority).
func (s *Store) ReadAuthority(ctx context.Context, key authority.Key) (res authority.ReadResult, err error) {
	ctx, op := s.obs.Start(ctx, observe.OpRead)
	res, err = s.readAuthority(ctx, key)
	op.End(res.Kind, err)
	return res, err
}

// CompareExchangeAuthority applies m to the active row at key when its
// version is expected (the work: compareExchangeAuthority).
func (s *Store) CompareExchangeAuthority(ctx context.Context, key authority.Key, expected authority.StoreVersion, m authority.Mutation) (res authority.CompareExchangeResult, err error) {
	ctx, op := s.obs.Start(ctx, observe.OpCompareExchange)
	res, err = s.compareExchangeAuthority(ctx, key, expected, m)
	op.End(res.Kind, err)
	return res, err
}

// ListAuthorities returns one page of rows under prefix (the work:
// listAuthorities).
func (s *Store) ListAuthorities(ctx context.Context, prefix string, cursor authority.ScanCursor, limit int) (res authority.ScanResult, err error) {
	ctx, op := s.obs.Start(ctx, observe.OpList)
	res, err = s.listAuthorities(ctx, prefix, cursor, limit)
	op.End(res.Kind, err)
	return res, err
}

// RemoveAllByOwner deletes every row of owner and returns how many (the
// work: removeAllByOwner).
func (s *Store) RemoveAllByOwner(ctx context.Context, owner authority.OwnerToken) (n int64, err error) {
	ctx, op := s.obs.Start(ctx, observe.OpRemoveAllByOwner)
	n, err = s.removeAllByOwner(ctx, owner)
	op.End("", err)
	return n, err
}

// Reserve reserves a row for a creation (the work: reserve).
func (s *Store) Reserve(ctx context.Context, req authority.ReserveRequest) (res authority.ReserveResult, err error) {
	ctx, op := s.obs.Start(ctx, observe.OpReserve)
	res, err = s.reserve(ctx, req)
	op.End(res.Kind, err)
	return res, err
}

// Commit activates a reserved row (the work: commit).
func (s *Store) Commit(ctx context.Context, req authority.CommitRequest) (res authority.CommitResult, err error) {
	ctx, op := s.obs.Start(ctx, observe.OpCommit)
	res, err = s.commit(ctx, req)
	op.End(res.Kind, err)
	return res, err
}

// CompleteCreation commits or fails a reservation and records the creation
// terminal (the work: completeCreation).
func (s *Store) CompleteCreation(ctx context.Context, req authority.CompleteCreationRequest) (res authority.CompleteCreationResult, err error) {
	ctx, op := s.obs.Start(ctx, observe.OpCompleteCreation)
	res, err = s.completeCreation(ctx, req)
	op.End(res.Kind, err)
	return res, err
}

// ReadCreationTerminal reads a creation operation's terminal (the work:
// readCreationTerminal).
func (s *Store) ReadCreationTerminal(ctx context.Context, o authority.CreationOperation) (res authority.TerminalReadResult, err error) {
	ctx, op := s.obs.Start(ctx, observe.OpReadTerminal)
	res, err = s.readCreationTerminal(ctx, o)
	op.End(res.Kind, err)
	return res, err
}

// Abort releases a reservation (the work: abort).
func (s *Store) Abort(ctx context.Context, req authority.AbortRequest) (res authority.AbortResult, err error) {
	ctx, op := s.obs.Start(ctx, observe.OpAbort)
	res, err = s.abort(ctx, req)
	op.End(res.Kind, err)
	return res, err
}

// PrepareAggregate prepares an aggregate move (the work: prepareAggregate).
func (s *Store) PrepareAggregate(ctx context.Context, req authority.AggregatePrepareRequest) (res authority.PrepareAggregateResult, err error) {
	ctx, op := s.obs.Start(ctx, observe.OpPrepareAggregate)
	res, err = s.prepareAggregate(ctx, req)
	op.End(res.Kind, err)
	return res, err
}

// CommitAggregate commits a prepared aggregate (the work: commitAggregate).
func (s *Store) CommitAggregate(ctx context.Context, fence authority.Fence) (res authority.CommitAggregateResult, err error) {
	ctx, op := s.obs.Start(ctx, observe.OpCommitAggregate)
	res, err = s.commitAggregate(ctx, fence)
	op.End(res.Kind, err)
	return res, err
}

// AbortAggregate aborts a prepared aggregate (the work: abortAggregate).
func (s *Store) AbortAggregate(ctx context.Context, fence authority.Fence) (res authority.AbortAggregateResult, err error) {
	ctx, op := s.obs.Start(ctx, observe.OpAbortAggregate)
	res, err = s.abortAggregate(ctx, fence)
	op.End(res.Kind, err)
	return res, err
}

// CapacityUsage reports a node lifecycle's used capacity (the work:
// capacityUsage).
func (s *Store) CapacityUsage(ctx context.Context, node authority.NodeDescriptor, lifecycleGeneration int64, objectKind authority.ObjectKind, stableType string) (res authority.CapacityUsage, err error) {
	ctx, op := s.obs.Start(ctx, observe.OpCapacityUsage)
	res, err = s.capacityUsage(ctx, node, lifecycleGeneration, objectKind, stableType)
	op.End("", err)
	return res, err
}

// WaitForChange waits until the row at key is no longer at seen (the work:
// waitForChange).
func (s *Store) WaitForChange(ctx context.Context, key authority.Key, seen authority.StoreVersion) (err error) {
	ctx, op := s.obs.Start(ctx, observe.OpWaitForChange)
	err = s.waitForChange(ctx, key, seen)
	op.End("", err)
	return err
}
