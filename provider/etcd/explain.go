package etcd

import (
	"context"
	"errors"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/zlink-systems/authority/internal/observe"
	"github.com/zlink-systems/authority/provider/etcd/internal/txnkit"
	"github.com/zlink-systems/authority/provider/etcd/schema"
)

// txnFailed maps the error of a Txn the store sent (write: it had writes)
// and records what an operator needs to see of it.
func (s *Store) txnFailed(err error, write bool) error {
	if errors.Is(err, rpctypes.ErrNoSpace) || errors.Is(err, rpctypes.ErrGRPCNoSpace) {
		s.obs.Metrics().NoSpace()
		s.obs.Logger().Warn("etcd is over its backend quota (NOSPACE alarm): writes are refused until compaction, defrag and alarm disarm")
	}
	mapped := mapError(err, write)
	if errors.Is(mapped, ErrClusterRegressed) {
		s.obs.Logger().Error("the etcd cluster went back in time or changed: every request is refused until the store is reopened", "error", err)
	}
	return mapped
}

// explainFailure names the compare of t that did not hold, on ctx's span
// (attribute authority.failed_compare) and in the failed-compare metric
// (txnkit.Explain): first on the keys the failed Txn's own Else read (resp),
// at no cost; only when none of those fails does it read the other compared
// keys, once, and only when something will show the answer.
func (s *Store) explainFailure(ctx context.Context, t *txnkit.Txn, resp *clientv3.TxnResponse) {
	if len(t.Cmps) == 0 || !s.obs.Explaining(ctx) {
		return
	}
	failed, unread := txnkit.Explain(t, resp)
	if failed != nil {
		s.obs.Refused(ctx, compareKind(s.keys, string(failed.Key)))
		return
	}
	if len(unread) == 0 {
		return // every compare holds now: the keys changed back
	}
	var gets []clientv3.Op
	reads := make([]txnkit.RangeRead, len(unread))
	for i, c := range unread {
		gets, reads[i] = txnkit.AddRead(gets, txnkit.ReadOf(c))
	}
	again, err := s.read(ctx, gets...)
	if err != nil {
		return
	}
	for i, c := range unread {
		if !txnkit.Holds(c, reads[i].In(again).Kvs) {
			s.obs.Refused(ctx, compareKind(s.keys, string(c.Key)))
			return
		}
	}
}

// compareKind names what a compare on key guards, by the key's layout
// segment.
func compareKind(l schema.Layout, key string) observe.Compare {
	switch l.Segment(key) {
	case schema.SegOwners, schema.SegOwnerGens:
		return observe.CompareOwnerLease
	case schema.SegCapacity, schema.SegCapacityEpochs:
		return observe.CompareCapacityEpoch
	case schema.SegAggregates:
		return observe.CompareAggregateRecord
	case schema.SegReservations, schema.SegTerminals:
		return observe.CompareReservation
	}
	return observe.CompareRowVersion
}
