package main

import (
	"context"

	clientv3 "go.etcd.io/etcd/client/v3"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/provider/etcd/schema"
)

// ownerIndexQueries are the ranges that name owner's rows, read at rev (0:
// the current revision): its owner index (rows placed before store version
// FewerKeys; keys only) and its placement keys on each node lifecycle its
// owner directory names (from FewerKeys on; a placement key is also the
// row's capacity entry, so its value is read too).
func ownerIndexQueries(ctx context.Context, c *clientv3.Client, ns string, owner authority.OwnerToken, rev int64) ([]entryQuery, error) {
	var at []clientv3.OpOption
	if rev > 0 {
		at = append(at, clientv3.WithRev(rev))
	}
	l := schema.NewLayout(ns)
	qs := []entryQuery{{prefix: schema.OwnerIndexPrefix(ns, owner), opts: append([]clientv3.OpOption{clientv3.WithKeysOnly()}, at...)}}
	dirs, _, err := rangeAll(ctx, c, l.OwnerNodesPrefix(owner), append([]clientv3.OpOption{clientv3.WithKeysOnly()}, at...)...)
	if err != nil {
		return nil, err
	}
	for _, kv := range dirs {
		node, lifecycle, err := l.ParseOwnerNode(owner, string(kv.Key))
		if err != nil {
			return nil, err
		}
		qs = append(qs, entryQuery{prefix: l.PlacementOwnerPrefix(node, lifecycle, owner), opts: at})
	}
	return qs, nil
}

// ownerIndexCount is how many rows owner's index names at rev.
func ownerIndexCount(ctx context.Context, c *clientv3.Client, ns string, owner authority.OwnerToken, rev int64) (int64, error) {
	qs, err := ownerIndexQueries(ctx, c, ns, owner, rev)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, q := range qs {
		cnt, err := c.Get(ctx, q.prefix, append([]clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithCountOnly()}, q.opts...)...)
		if err != nil {
			return 0, err
		}
		n += cnt.Count
	}
	return n, nil
}
