package etcd

import (
	"context"

	"github.com/zlink-systems/authority/provider/etcd/internal/txnkit"
)

// dropExpired deletes key, a record this store read at ModRevision rev and
// judged expired, in one Txn fenced on that ModRevision: a record written
// anew since (a new creation terminal) stays, and a record already gone is
// left gone. etcd removes an expired record only when its lease runs out,
// after its expiry; until then each store judges it on its own clock. The
// delete makes the expiry this store saw hold for every store, whatever
// their clocks do (docs/deviations.md C18). A Txn whose compare fails
// succeeded as far as the caller cares: the record it judged is gone. A
// read-only store deletes nothing: it answers as if the record were gone,
// and leaves it to a writer's read or its lease.
func (s *Store) dropExpired(ctx context.Context, key string, rev int64) error {
	if s.readOnly {
		return nil
	}
	t := &txnkit.Txn{}
	t.Cmp(modRevIs(key, rev))
	t.Del(key)
	if err := s.check(t, "the expired record's delete"); err != nil {
		return err
	}
	_, err := s.batch.Commit(ctx, t)
	return err
}
