package etcd

import (
	"context"
	"strings"

	authority "github.com/zlink-systems/authority"
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
