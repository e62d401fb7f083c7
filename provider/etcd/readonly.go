package etcd

import (
	"context"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	authority "github.com/zlink-systems/authority"
)

// ErrReadOnly reports a write refused by a store opened with
// Config.ReadOnly. The error also wraps authority.ErrAccessDenied: the write
// was never sent.
var ErrReadOnly = errors.New("etcd: store opened read-only")

// readOnlyError is the error every write of a read-only store fails with.
func (s *Store) readOnlyError() error {
	return authority.Wrap(authority.ErrAccessDenied, fmt.Sprintf(
		"the store on namespace %s was opened read-only (Config.ReadOnly): it writes nothing", s.keys.Namespace()), ErrReadOnly)
}

// refuseWrite returns the read-only error of a read-only store (nil
// otherwise): the check of a write that starts with something other than a
// KV request (a lease grant).
func (s *Store) refuseWrite() error {
	if !s.readOnly {
		return nil
	}
	return s.readOnlyError()
}

// readOnlyKV is the KV of a read-only store: it passes reads (and Txns of
// reads only) and refuses every request that could change a key before it
// is sent. Its errors pass mapError unchanged (they wrap ErrReadOnly).
type readOnlyKV struct {
	clientv3.KV
	refused error
}

func (k readOnlyKV) Put(context.Context, string, string, ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	return nil, k.refused
}

func (k readOnlyKV) Delete(context.Context, string, ...clientv3.OpOption) (*clientv3.DeleteResponse, error) {
	return nil, k.refused
}

func (k readOnlyKV) Compact(context.Context, int64, ...clientv3.CompactOption) (*clientv3.CompactResponse, error) {
	return nil, k.refused
}

func (k readOnlyKV) Do(ctx context.Context, op clientv3.Op) (clientv3.OpResponse, error) {
	if !op.IsGet() {
		return clientv3.OpResponse{}, k.refused
	}
	return k.KV.Do(ctx, op)
}

func (k readOnlyKV) Txn(ctx context.Context) clientv3.Txn {
	return &readOnlyTxn{txn: k.KV.Txn(ctx), refused: k.refused}
}

// readOnlyTxn is a Txn whose Commit is refused when a branch holds a write.
type readOnlyTxn struct {
	txn     clientv3.Txn
	refused error
	write   bool
}

func (t *readOnlyTxn) If(cs ...clientv3.Cmp) clientv3.Txn { t.txn = t.txn.If(cs...); return t }

func (t *readOnlyTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.write = t.write || writes(ops)
	t.txn = t.txn.Then(ops...)
	return t
}

func (t *readOnlyTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.write = t.write || writes(ops)
	t.txn = t.txn.Else(ops...)
	return t
}

func (t *readOnlyTxn) Commit() (*clientv3.TxnResponse, error) {
	if t.write {
		return nil, t.refused
	}
	return t.txn.Commit()
}

// writes tells whether ops hold anything but a read.
func writes(ops []clientv3.Op) bool {
	for _, op := range ops {
		if !op.IsGet() {
			return true
		}
	}
	return false
}
