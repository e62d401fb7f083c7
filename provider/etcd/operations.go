package etcd

import (
	"context"
	"time"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/internal/observe"
)

// The public operations, each recorded by the store's observer (metrics,
// span, outcome) around the method that does the work: the contract's (one
// wrapper for both providers, observe.Contract) and this provider's own.

// contract is the provider contract, observed: Store embeds it, so
// ReadAuthority, Reserve and the rest are its methods.
type contract = observe.Contract

// work lists the methods that do each contract operation's work; a
// read-only store (Config.ReadOnly) refuses every write before its work
// starts, whatever it would have written.
func (s *Store) work() observe.Work {
	return observe.Work{
		ReadAuthority: s.readAuthority,
		CompareExchangeAuthority: func(ctx context.Context, key authority.Key, expected authority.StoreVersion, m authority.Mutation) (authority.CompareExchangeResult, error) {
			if err := s.refuseWrite(); err != nil {
				return authority.CompareExchangeResult{}, err
			}
			return s.compareExchangeAuthority(ctx, key, expected, m)
		},
		ListAuthorities:      s.listAuthorities,
		RemoveAllByOwner:     writing(s, s.removeAllByOwner),
		Reserve:              writing(s, s.reserve),
		Commit:               writing(s, s.commitReservation),
		CompleteCreation:     writing(s, s.completeCreation),
		ReadCreationTerminal: s.readCreationTerminal,
		Abort:                writing(s, s.abort),
		PrepareAggregate:     writing(s, s.prepareAggregate),
		CommitAggregate:      writing(s, s.commitPrepared),
		AbortAggregate:       writing(s, s.abortPrepared),
		CapacityUsage:        s.capacityUsage,
		WaitForChange:        s.waitForChange,
	}
}

// writing wraps a write operation's work so that a read-only store refuses
// it before it starts.
func writing[Req, Res any](s *Store, work func(context.Context, Req) (Res, error)) func(context.Context, Req) (Res, error) {
	return func(ctx context.Context, req Req) (res Res, err error) {
		if err = s.refuseWrite(); err != nil {
			return res, err
		}
		return work(ctx, req)
	}
}

// PruneCapacityEpochs deletes the capacity epochs of node lifecycles that
// hold no capacity, and the owner directory keys (store version FewerKeys)
// that name no placement key, and returns how many keys it deleted (the
// work: pruneCapacityEpochs).
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
// acquire). lifecycle is the node's lifecycle generation, the scope of its
// rows, set by the node's runtime: after a lease is lost, or after a
// restart that keeps the node's rows, Acquire again on the rows' lifecycle
// and RebindRows. Each Acquire is the owner's next lease generation.
func (r *Registry) Acquire(ctx context.Context, node authority.NodeDescriptor, lifecycle int64, ownerID string, ttl time.Duration) (l *OwnerLease, err error) {
	ctx, op := r.s.obs.Start(ctx, observe.OpOwnerLeaseAcquire)
	if err = r.s.refuseWrite(); err == nil {
		l, err = r.acquire(ctx, node, lifecycle, ownerID, ttl)
	}
	op.End("", err)
	return l, err
}

// RebindRows moves every row of from, an earlier lease generation of this
// lease's owner on this lease's node lifecycle, to this lease and returns
// how many (the work: rebindRows). Any other from (another owner's token,
// this lease's own, a later generation) is refused with ErrInvalidArgument
// before anything is written; rows on another node or node lifecycle are
// refused with ErrInvalidArgument naming both: those move with an
// aggregate.
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
