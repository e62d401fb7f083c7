package etcd

import (
	"context"
	"time"

	"github.com/zlink-systems/authority/provider/etcd/internal/txnkit"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Deleting a row that answers a retry of its commit (storeversion.FewerKeys).
//
// From FewerKeys on a commit writes no reservation terminal: the row it
// made keeps the reservation (schema.Row.Committed) until the retention
// ends, and a retried commit finds it there (committedBy). The contract
// answers that retry alreadyCommitted for as long as a terminal would have
// lived, also after the row was deleted and its key created again by
// another reservation (conformance: RetryAfterKeyRecreatedAndCommittedReportsNewRow).
// So a Txn that deletes such a row writes the reservation terminal the
// commit did not, in the same Txn, expiring when the row's answer would
// have: the answer moves from the row to the terminal atomically, and a
// row deleted after its retention writes nothing.

// retiredCommit is the reservation terminal a Txn deleting a row writes.
type retiredCommit struct {
	key, value string
	ttl        time.Duration
}

// retireCommit returns the reservation terminal that deleting r writes
// (ok false: none, r answers no retry).
func (s *Store) retireCommit(r *schema.Row) (retiredCommit, bool) {
	c := r.Committed
	if c == nil {
		return retiredCommit{}, false
	}
	ttl := c.Until.Sub(s.clock.Now())
	if ttl <= 0 {
		return retiredCommit{}, false
	}
	rec := schema.ReservationTerminal{State: schema.ReservationCommitted, ExpiresAt: c.Until}
	return retiredCommit{key: s.keys.Reservation(c.ID), value: rec.Encode(), ttl: ttl}, true
}

// sendRetiring sends t plus the put of every terminal in retired, each on
// a lease that outlives it (as every terminal is); what names t in errors.
func (s *Store) sendRetiring(ctx context.Context, t *txnkit.Txn, retired []retiredCommit, what string) (*clientv3.TxnResponse, error) {
	if len(retired) == 0 {
		return s.sendWrite(ctx, t, what)
	}
	ttls := make([]time.Duration, len(retired))
	for i, r := range retired {
		ttls[i] = r.ttl
	}
	var resp *clientv3.TxnResponse
	err := s.leases.withLeases(ctx, ttls, func(ids []clientv3.LeaseID) error {
		tt := t.Clone()
		for i, r := range retired {
			tt.Put(r.key, r.value, clientv3.WithLease(ids[i]))
		}
		var err error
		resp, err = s.sendWrite(ctx, tt, what)
		return err
	})
	return resp, err
}
