package etcd

import (
	"context"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/internal/observe"
	"github.com/zlink-systems/authority/provider/etcd/internal/txnkit"
)

// Reads a store over several clusters (provider/sharded) makes of each shard
// beyond the contract's: a listing page with the revision it was read at
// (to merge the shards' pages under one cursor), and whether an aggregate
// record exists (to find the shard an aggregate was prepared in).

// ListPageAt returns the page of rows under prefix after the key after (""
// from the prefix's first row) at revision rev (0: the current revision),
// with the revision it was read at, as ListAuthorities reads a page: a
// revision etcd compacted is KindScanExpired, a future one ErrInvalidArgument.
// It is recorded as a ListAuthorities operation.
func (s *Store) ListPageAt(ctx context.Context, prefix string, after authority.Key, rev int64, limit int) (res authority.ScanResult, at int64, err error) {
	ctx, op := s.obs.Start(ctx, observe.OpList)
	defer func() { op.End(res.Kind, err) }()
	if rev < 0 || after != "" && (authority.ValidateKey(after) != nil || len(after) < len(prefix) || string(after[:len(prefix)]) != prefix) {
		return authority.ScanResult{}, 0, authority.Invalid("Authority scan cursor is invalid.")
	}
	return s.listPage(ctx, prefix, after, rev, limit)
}

// HasAggregate reports whether the namespace holds the record of the
// aggregate fence names (prepared, committed or aborted, until it expires),
// read linearizably.
func (s *Store) HasAggregate(ctx context.Context, fence authority.Fence) (bool, error) {
	if err := authority.ValidateFence(fence); err != nil {
		return false, err
	}
	if err := s.begin(ctx); err != nil {
		return false, err
	}
	key := s.keys.Aggregate(fence)
	resp, err := s.read(ctx, opGet(key))
	if err != nil {
		return false, err
	}
	return txnkit.ReadsOf(resp)[key] != nil, nil
}
