package etcd

import (
	"context"
	"strings"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/provider/etcd/internal/txnkit"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ownerIndexPage is how many owner index entries RemoveAllByOwner and
// RebindRows read at once (keys only, about 100 bytes each).
var ownerIndexPage = 4096

// readOwnerIndex reads the next page of an owner's index (prefix: the
// owner's index prefix) from from (prefix itself: its start) and returns
// the row keys it names, in order, and whether more entries follow. A page
// is streamed (scanPage): it costs its own entries, never the ones after it
// nor the deleted ones before from, so a walk of the whole index is linear
// in the owner's rows.
func (s *Store) readOwnerIndex(ctx context.Context, prefix, from string) (keys []authority.Key, more bool, err error) {
	rctx, cancel := s.requestContext(ctx)
	defer cancel()
	p, err := s.scanPage(rctx, from, prefix, prefixEnd(prefix), int64(ownerIndexPage), clientv3.WithKeysOnly())
	if err != nil {
		return nil, false, mapError(err, false)
	}
	keys = make([]authority.Key, len(p.Kvs))
	for i, kv := range p.Kvs {
		keys[i] = authority.Key(strings.TrimPrefix(string(kv.Key), prefix))
	}
	return keys, p.More, nil
}

// nodeLifecycle names one node lifecycle.
type nodeLifecycle struct {
	node      authority.NodeDescriptor
	lifecycle int64
}

// ownerNodes returns the node lifecycles owner's directory names: those it
// may hold placement keys on (storeversion.FewerKeys; placement.go). One
// owner lease generation is placed on few node lifecycles, so the listing
// is one read (a directory past the client's receive limit fails it).
func (s *Store) ownerNodes(ctx context.Context, owner authority.OwnerToken) ([]nodeLifecycle, error) {
	rctx, cancel := s.requestContext(ctx)
	defer cancel()
	prefix := s.keys.OwnerNodesPrefix(owner)
	resp, err := s.kv.Get(rctx, prefix, clientv3.WithRange(prefixEnd(prefix)), clientv3.WithKeysOnly())
	if err != nil {
		return nil, mapError(err, false)
	}
	nodes := make([]nodeLifecycle, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		node, lifecycle, err := s.keys.ParseOwnerNode(owner, string(kv.Key))
		if err != nil {
			return nil, err
		}
		nodes = append(nodes, nodeLifecycle{node, lifecycle})
	}
	return nodes, nil
}

// dropOwnerNode deletes owner's directory key of a node lifecycle if its
// placement range there is empty, both in one Txn (a range compare), and
// reports whether it did. A Txn that puts a placement key there puts the
// directory key too, so the directory names every node lifecycle that
// holds a placement key of the owner at every revision.
func (s *Store) dropOwnerNode(ctx context.Context, owner authority.OwnerToken, at nodeLifecycle) (bool, error) {
	placed := s.keys.PlacementOwnerPrefix(at.node, at.lifecycle, owner)
	t := &txnkit.Txn{}
	t.Cmp(clientv3.Compare(clientv3.CreateRevision(placed), "=", 0).WithRange(prefixEnd(placed)))
	t.Del(s.keys.OwnerNode(owner, at.node, at.lifecycle))
	resp, err := s.sendWrite(ctx, t, "dropping an owner's directory key")
	if err != nil {
		return false, err
	}
	return resp.Succeeded, nil
}

// eachOwnerNode calls walk for every node lifecycle owner's directory
// names, and after each deletes the directory key if walk left its
// placement range empty (dropOwnerNode). It lists the directory again
// until a listing names none: a node lifecycle that gained rows behind
// walk is walked again, as RemoveAllByOwner reads its index again for rows
// added behind it.
func (s *Store) eachOwnerNode(ctx context.Context, owner authority.OwnerToken, walk func(authority.NodeDescriptor, int64) error) error {
	for {
		nodes, err := s.ownerNodes(ctx, owner)
		if err != nil || len(nodes) == 0 {
			return err
		}
		for _, at := range nodes {
			if err := walk(at.node, at.lifecycle); err != nil {
				return err
			}
			if _, err := s.dropOwnerNode(ctx, owner, at); err != nil {
				return err
			}
		}
	}
}
