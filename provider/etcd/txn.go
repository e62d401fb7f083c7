package etcd

import (
	"context"
	"errors"

	authority "github.com/zlink-systems/authority"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/zlink-systems/authority/provider/etcd/internal/txnkit"
)

// How the store sends the Txns its operations build (internal/txnkit builds
// them, batches writes and explains a failed one).

// limits are the Txn limits of the store's Config.
func (s *Store) limits() txnkit.Limits { return txnkit.Limits{MaxOps: s.maxOps, MaxBytes: s.maxBytes} }

// check refuses a Txn that cannot fit the configured limits.
func (s *Store) check(t *txnkit.Txn, what string) error { return s.limits().Check(t, what) }

// newBatcher returns the store's write batcher of slots slots.
func (s *Store) newBatcher(slots int) *txnkit.Batcher {
	return txnkit.NewBatcher(txnkit.BatcherConfig{
		Slots:     slots,
		Limits:    s.limits(),
		Send:      s.send,
		Abandoned: func(cause error) error { return mapError(cause, true) },
		Batched:   func(n int) { s.obs.Metrics().BatchedWrites(n) },
	})
}

// sendWrite sends t after checking it fits, alone or batched with concurrent
// writes (txnkit.Batcher). The caller checks Succeeded. A failed Txn that
// found a row lock (lockFree) is a RowLockedError.
func (s *Store) sendWrite(ctx context.Context, t *txnkit.Txn, what string) (*clientv3.TxnResponse, error) {
	resp, err := s.sendRaw(ctx, t, what)
	if err == nil && !resp.Succeeded {
		if err := s.locksIn(resp); err != nil {
			return nil, err
		}
		s.explainFailure(ctx, t, resp)
	}
	return resp, err
}

// send sends t as one Txn.
func (s *Store) send(ctx context.Context, t *txnkit.Txn) (*clientv3.TxnResponse, error) {
	ctx, cancel := s.requestContext(ctx)
	defer cancel()
	ctx, end := s.obs.RoundTrip(ctx, "etcd.Txn", t.Ops())
	resp, err := s.kv.Txn(ctx).If(t.Cmps...).Then(t.ThenOps()...).Else(t.Els...).Commit()
	if err != nil {
		err = s.txnFailed(err, len(t.Then) > 0)
	}
	end(err)
	s.obs.Metrics().TxnSent(t.Ops(), t.Bytes, err == nil && resp.Succeeded, err, errors.Is(err, authority.ErrOutcomeUnknown))
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// read sends a read-only Txn of gets (one round trip, one revision).
func (s *Store) read(ctx context.Context, ops ...clientv3.Op) (*clientv3.TxnResponse, error) {
	ops, mapRev, fenced := s.fenceRead(ctx, ops)
	ctx, cancel := s.requestContext(ctx)
	defer cancel()
	ctx, end := s.obs.RoundTrip(ctx, "etcd.Txn", len(ops))
	resp, err := s.kv.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		err = s.txnFailed(err, false)
	}
	end(err)
	if err != nil {
		return nil, err
	}
	if fenced {
		if err := s.readChanged(resp, mapRev); err != nil {
			return nil, err
		}
	}
	return resp, nil
}

type mvccpbKV = mvccpb.KeyValue

// modRevIs compares a key's ModRevision (0: the key is absent).
func modRevIs(key string, rev int64) clientv3.Cmp {
	return clientv3.Compare(clientv3.ModRevision(key), "=", rev)
}

func opGet(key string) clientv3.Op { return clientv3.OpGet(key) }

// DefaultMaxConcurrentTxns is the default Config.MaxConcurrentTxns.
const DefaultMaxConcurrentTxns = 4

// WriteStats counts a store's write Txns since New.
type WriteStats struct {
	// Txns is every write Txn sent (alone or merged).
	Txns int64
	// Batches is the merged Txns sent, and BatchedWrites the writes they
	// carried.
	Batches, BatchedWrites int64
	// Fallbacks is the merged Txns that did not apply (a compare failed or
	// etcd refused them), whose writes were then sent alone.
	Fallbacks int64
}

// WriteStats returns the store's write Txn counts.
func (s *Store) WriteStats() WriteStats {
	st := s.batch.Stats()
	return WriteStats{Txns: st.Txns, Batches: st.Batches, BatchedWrites: st.BatchedWrites, Fallbacks: st.Fallbacks}
}
