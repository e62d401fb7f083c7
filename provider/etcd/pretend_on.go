//go:build authority_next

package etcd

import (
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/zlink-systems/authority/provider/etcd/internal/txnkit"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/etcd/storeversion"
)

// pretendWrite applies storeversion.NextPretend's rules to the write of
// next over cur, once the namespace is at NextPretend: the row counts its
// writes (a field no released build can read), and the write is fenced on
// the namespace's active version (a compare in the same Txn). Before that,
// it writes what a released build writes.
func (s *Store) pretendWrite(t *txnkit.Txn, cur, next *schema.Row) {
	if !s.atLeast(storeversion.NextPretend) {
		return
	}
	next.Pretend.Writes = cur.Pretend.Writes + 1
	t.Cmp(clientv3.Compare(clientv3.Value(s.keys.ActiveVersion()), "=", schema.EncodeActiveVersion(storeversion.NextPretend)))
}
