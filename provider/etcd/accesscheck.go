package etcd

import (
	"context"
	"errors"
	"fmt"

	authority "github.com/zlink-systems/authority"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// checkAccess makes sure the client's etcd user may read and write the
// namespace (every store but a read-only one writes: it announces itself), so that a role that
// does not cover it is named at New rather than at the first operation. The
// read is a keys-only Get of one key under the namespace; the write is a Txn
// whose compare can never hold (a version below zero) with a put of the
// namespace key in its then-branch (harmless were it ever applied): etcd
// checks the permissions of both branches before it evaluates the compare,
// and writes nothing. A server without the KV service (a test
// double answering only Status) is not checked.
func (s *Store) checkAccess(ctx context.Context) error {
	ctx, cancel := s.requestContext(ctx)
	defer cancel()
	if _, has := ctx.Deadline(); !has {
		var cancelDial context.CancelFunc
		ctx, cancelDial = context.WithTimeout(ctx, s.dialTimeout)
		defer cancelDial()
	}
	ns := s.keys.Namespace()
	_, err := s.client.KV.Get(ctx, ns, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(1))
	if err != nil {
		return s.accessError(err, "read")
	}
	if s.readOnly {
		return nil // it will not write: a read-only role will do
	}
	_, err = s.client.KV.Txn(ctx).
		If(clientv3.Compare(clientv3.Version(ns), "<", 0)).
		Then(clientv3.OpPut(ns, "")).
		Commit()
	if err != nil {
		return s.accessError(err, "readwrite")
	}
	return nil
}

// accessError names the user and the permission it lacks when err is etcd's
// permission denied; other errors are mapped as a read's.
func (s *Store) accessError(err error, permission string) error {
	if status.Code(err) == codes.Unimplemented {
		return nil
	}
	if !errors.Is(err, rpctypes.ErrPermissionDenied) {
		return mapError(err, false)
	}
	user := fmt.Sprintf("etcd user %q", s.client.Username)
	if s.client.Username == "" {
		user = "the etcd user of the client certificate (its common name)"
	}
	ns := s.keys.Namespace()
	return authority.Wrap(authority.ErrAccessDenied, fmt.Sprintf(
		"%s lacks %s permission on the namespace prefix %q: grant its role readwrite on that prefix "+
			"(etcdctl role grant-permission ROLE --prefix=true readwrite %s)", user, permission, ns, ns), err)
}
