package etcd

import (
	"context"
	"errors"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// waitForChange returns once the row at key is no longer at version seen
// (zero: absent), or when ctx ends (returning ctx.Err()), or when the store is
// closed (returning authority.ErrClosed). It reads the row, then watches it
// from the read's revision + 1, so no change is missed.
func (s *Store) waitForChange(ctx context.Context, key authority.Key, seen authority.StoreVersion) error {
	if err := authority.ValidateKey(key); err != nil {
		return err
	}
	if err := s.begin(ctx); err != nil {
		return err
	}
	rowKey := s.keys.Row(key)
	rctx, cancel := s.requestContext(ctx)
	resp, err := s.kv.Get(rctx, rowKey, clientv3.WithKeysOnly())
	cancel()
	if err != nil {
		return mapError(err, false)
	}
	var rev int64
	if len(resp.Kvs) > 0 {
		rev = resp.Kvs[0].ModRevision
	}
	if schema.Version(rev) != seen {
		// a row a resharding copied keeps its version until its next
		// write: read it to tell
		if rev == 0 || seen == "" {
			return nil
		}
		if r, err := s.loadRow(ctx, key); err != nil || r == nil || r.ModRev != rev || r.Version() != seen {
			return err
		}
	}
	wctx, stop := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer stop()
	defer context.AfterFunc(s.life, stop)()
	for wr := range s.client.Watch(wctx, rowKey, clientv3.WithRev(resp.Header.Revision+1)) {
		if err := wr.Err(); err != nil {
			if s.closed.Load() {
				return authority.ErrClosed
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.Is(err, context.Canceled) {
				return err
			}
			// compacted past our revision or lost the leader: the caller
			// must re-read anyway
			return nil
		}
		if len(wr.Events) > 0 {
			return nil
		}
	}
	if s.closed.Load() {
		return authority.ErrClosed
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return authority.Wrap(authority.ErrUnavailable, "etcd watch ended", nil)
}
