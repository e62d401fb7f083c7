package etcd

import (
	"context"
	"time"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/internal/observe"
)

// The contract operations, each recorded by the store's observer (metrics,
// span, outcome) around the method that does the work. A read-only store
// (Config.ReadOnly) refuses every write here, whatever it would have
// written.

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
	if err = s.refuseWrite(); err == nil {
		res, err = s.compareExchangeAuthority(ctx, key, expected, m)
	}
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
	if err = s.refuseWrite(); err == nil {
		n, err = s.removeAllByOwner(ctx, owner)
	}
	op.End("", err)
	return n, err
}

// Reserve reserves a row for a creation (the work: reserve).
func (s *Store) Reserve(ctx context.Context, req authority.ReserveRequest) (res authority.ReserveResult, err error) {
	ctx, op := s.obs.Start(ctx, observe.OpReserve)
	if err = s.refuseWrite(); err == nil {
		res, err = s.reserve(ctx, req)
	}
	op.End(res.Kind, err)
	return res, err
}

// Commit activates a reserved row (the work: commitReservation).
func (s *Store) Commit(ctx context.Context, req authority.CommitRequest) (res authority.CommitResult, err error) {
	ctx, op := s.obs.Start(ctx, observe.OpCommit)
	if err = s.refuseWrite(); err == nil {
		res, err = s.commitReservation(ctx, req)
	}
	op.End(res.Kind, err)
	return res, err
}

// CompleteCreation commits or fails a reservation and records the creation
// terminal (the work: completeCreation).
func (s *Store) CompleteCreation(ctx context.Context, req authority.CompleteCreationRequest) (res authority.CompleteCreationResult, err error) {
	ctx, op := s.obs.Start(ctx, observe.OpCompleteCreation)
	if err = s.refuseWrite(); err == nil {
		res, err = s.completeCreation(ctx, req)
	}
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
	if err = s.refuseWrite(); err == nil {
		res, err = s.abort(ctx, req)
	}
	op.End(res.Kind, err)
	return res, err
}

// PrepareAggregate prepares an aggregate move (the work: prepareAggregate).
func (s *Store) PrepareAggregate(ctx context.Context, req authority.AggregatePrepareRequest) (res authority.PrepareAggregateResult, err error) {
	ctx, op := s.obs.Start(ctx, observe.OpPrepareAggregate)
	if err = s.refuseWrite(); err == nil {
		res, err = s.prepareAggregate(ctx, req)
	}
	op.End(res.Kind, err)
	return res, err
}

// CommitAggregate commits a prepared aggregate (the work: commitPrepared).
func (s *Store) CommitAggregate(ctx context.Context, fence authority.Fence) (res authority.CommitAggregateResult, err error) {
	ctx, op := s.obs.Start(ctx, observe.OpCommitAggregate)
	if err = s.refuseWrite(); err == nil {
		res, err = s.commitPrepared(ctx, fence)
	}
	op.End(res.Kind, err)
	return res, err
}

// AbortAggregate aborts a prepared aggregate (the work: abortPrepared).
func (s *Store) AbortAggregate(ctx context.Context, fence authority.Fence) (res authority.AbortAggregateResult, err error) {
	ctx, op := s.obs.Start(ctx, observe.OpAbortAggregate)
	if err = s.refuseWrite(); err == nil {
		res, err = s.abortPrepared(ctx, fence)
	}
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

// PruneCapacityEpochs deletes the capacity epochs of node lifecycles that
// hold no capacity and returns how many (the work: pruneCapacityEpochs).
func (s *Store) PruneCapacityEpochs(ctx context.Context) (n int, err error) {
	ctx, op := s.obs.Start(ctx, observe.OpPruneEpochs)
	if err = s.refuseWrite(); err == nil {
		n, err = s.pruneCapacityEpochs(ctx)
	}
	op.End("", err)
	if err == nil {
		s.obs.Logger().Info("pruned capacity epochs", "epochs", n)
	}
	return n, err
}

// PutNew stores data under a new reference that expires after retention
// (the work: putNew).
func (r RelocationStore) PutNew(ctx context.Context, data []byte, retention time.Duration) (res authority.BlobReceipt, err error) {
	ctx, op := r.s.obs.Start(ctx, observe.OpRelocationPut)
	if err = r.s.refuseWrite(); err == nil {
		res, err = r.putNew(ctx, data, retention)
	}
	op.End("", err)
	if err == nil {
		r.s.obs.Metrics().RelocationBytes(len(data), true)
	}
	return res, err
}

// Read reads the blob at ref (the work: read).
func (r RelocationStore) Read(ctx context.Context, ref authority.BlobReference) (res authority.BlobReadResult, err error) {
	ctx, op := r.s.obs.Start(ctx, observe.OpRelocationRead)
	res, err = r.read(ctx, ref)
	op.End(res.Kind, err)
	if err == nil {
		r.s.obs.Metrics().RelocationBytes(len(res.Bytes), false)
	}
	return res, err
}

// Delete removes the blob; deleting a missing blob is not an error (the
// work: remove).
func (r RelocationStore) Delete(ctx context.Context, ref authority.BlobReference) (err error) {
	ctx, op := r.s.obs.Start(ctx, observe.OpRelocationDelete)
	if err = r.s.refuseWrite(); err == nil {
		err = r.remove(ctx, ref)
	}
	op.End("", err)
	return err
}

// Acquire grants an owner lease for ownerID on node's lifecycle (the work:
// acquire).
func (r *Registry) Acquire(ctx context.Context, node authority.NodeDescriptor, lifecycle int64, ownerID string, ttl time.Duration) (l *OwnerLease, err error) {
	ctx, op := r.s.obs.Start(ctx, observe.OpOwnerLeaseAcquire)
	if err = r.s.refuseWrite(); err == nil {
		l, err = r.acquire(ctx, node, lifecycle, ownerID, ttl)
	}
	op.End("", err)
	return l, err
}

// RebindRows moves every row of the owner from to this lease and returns
// how many (the work: rebindRows).
func (l *OwnerLease) RebindRows(ctx context.Context, from authority.OwnerToken) (n int64, err error) {
	ctx, op := l.r.s.obs.Start(ctx, observe.OpRebindRows)
	n, err = l.rebindRows(ctx, from)
	op.End("", err)
	l.r.s.obs.Logger().Info("rebound owner rows", "rows", n, "error", err)
	return n, err
}

// retrying counts attempt (from 0) of op's optimistic loop as a retry when
// it is not the first.
func (s *Store) retrying(op observe.Operation, attempt int) {
	if attempt > 0 {
		s.obs.Metrics().Retry(op)
	}
}
