//go:build !authority_next

package etcd

import (
	"github.com/zlink-systems/authority/provider/etcd/internal/txnkit"
	"github.com/zlink-systems/authority/provider/etcd/schema"
)

// pretendWrite applies storeversion.NextPretend's rules to a row write: in
// a released build there are none.
func (s *Store) pretendWrite(*txnkit.Txn, *schema.Row, *schema.Row) {}
