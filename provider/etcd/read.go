package etcd

import (
	"context"
	"errors"
	"strings"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/provider/etcd/internal/txnkit"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// readAuthority returns the row at key (KindSnapshot) or KindMissing.
func (s *Store) readAuthority(ctx context.Context, key authority.Key) (authority.ReadResult, error) {
	if err := authority.ValidateKey(key); err != nil {
		return authority.ReadResult{}, err
	}
	if err := s.begin(ctx); err != nil {
		return authority.ReadResult{}, err
	}
	r, err := s.loadRow(ctx, key)
	if err != nil {
		return authority.ReadResult{}, err
	}
	return s.readResult(r), nil
}

// loadRow reads the row at key (nil when missing).
func (s *Store) loadRow(ctx context.Context, key authority.Key) (*schema.Row, error) {
	if _, fenced := s.mapFence(ctx); fenced {
		resp, err := s.read(ctx, opGet(s.keys.Row(key)))
		if err != nil {
			return nil, err
		}
		return s.rowIn(txnkit.ReadsOf(resp), key)
	}
	ctx, cancel := s.requestContext(ctx)
	defer cancel()
	resp, err := s.kv.Get(ctx, s.keys.Row(key))
	if err != nil {
		return nil, mapError(err, false)
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	return s.decodeRow(key, resp.Kvs[0])
}

// decodeRow decodes a row key-value and remembers it in the cache.
func (s *Store) decodeRow(key authority.Key, kv *mvccpb.KeyValue) (*schema.Row, error) {
	if kv == nil {
		return nil, nil
	}
	if r := s.cache.get(string(kv.Key), kv.ModRevision); r != nil {
		return r, nil
	}
	r, err := schema.DecodeRow(key, kv)
	if err != nil {
		return nil, err
	}
	s.cache.put(string(kv.Key), r)
	return r, nil
}

// rowIn decodes the row at key from got (nil when missing).
func (s *Store) rowIn(got txnkit.Reads, key authority.Key) (*schema.Row, error) {
	return s.decodeRow(key, got[s.keys.Row(key)])
}

// cachedRow returns the row at key in the state named by expected, from the
// cache (nil when not cached or expected names no state).
func (s *Store) cachedRow(key authority.Key, expected authority.StoreVersion) *schema.Row {
	rev, ok := schema.ParseVersion(expected)
	if !ok || rev == 0 {
		return nil
	}
	r := s.cache.get(s.keys.Row(key), rev)
	if r != nil && r.Version() != expected {
		r = nil // a row a resharding copied: its version is not its ModRevision
	}
	s.obs.Metrics().RowCache(r != nil)
	return r
}

func (s *Store) remember(r *schema.Row) { s.cache.put(s.keys.Row(r.Key), r) }

func (s *Store) readResult(r *schema.Row) authority.ReadResult {
	now := s.clock.Now()
	if r == nil {
		return authority.Missing(now)
	}
	return authority.Found(r.Snapshot(now))
}

// listAuthorities lists rows whose key starts with prefix, limit at a time,
// each page at the revision of the first page. A cursor expires (KindScanExpired)
// only when etcd compacted past that revision.
func (s *Store) listAuthorities(ctx context.Context, prefix string, cursor authority.ScanCursor, limit int) (authority.ScanResult, error) {
	if err := authority.ValidateScanLimit(limit); err != nil {
		return authority.ScanResult{}, err
	}
	if err := authority.ValidateScanPrefix(prefix); err != nil {
		return authority.ScanResult{}, err
	}
	var pos authority.ScanPosition
	if cursor != "" {
		p, err := authority.DecodeScanCursor(cursor, s.keys.Namespace(), prefix)
		if err != nil {
			return authority.ScanResult{}, err
		}
		pos = p
	}
	out, _, err := s.listPage(ctx, prefix, pos.After, pos.Revision, limit)
	if err == nil && pos.Revision == 0 {
		// a first page, read at the current revision: under the map the
		// store is fenced on only if that has not moved (a single-cluster
		// store's standing fence, shardfence.go); later pages read at its
		// revision
		err = s.CheckShardMap(ctx)
	}
	return out, err
}

// listPage reads the page of rows under prefix after the key after ("": from
// the prefix's first row) at revision rev (0: the current one), and returns
// it with the revision it was read at. Its NextCursor continues it at that
// revision.
func (s *Store) listPage(ctx context.Context, prefix string, after authority.Key, rev int64, limit int) (authority.ScanResult, int64, error) {
	if err := authority.ValidateScanLimit(limit); err != nil {
		return authority.ScanResult{}, 0, err
	}
	if err := authority.ValidateScanPrefix(prefix); err != nil {
		return authority.ScanResult{}, 0, err
	}
	if err := s.begin(ctx); err != nil {
		return authority.ScanResult{}, 0, err
	}
	base := s.keys.RowsPrefix()
	from := base + prefix
	if after != "" {
		from = base + string(after) + "\x00"
	}
	rctx, cancel := s.requestContext(ctx)
	defer cancel()
	page, err := s.readPage(rctx, from, base+prefix, prefixEnd(base+prefix), rev, int64(limit))
	for attempt := 0; err != nil && after == "" && rev == 0 && errors.Is(err, rpctypes.ErrCompacted) && attempt < 3; attempt++ {
		// a first page read in parts (large rows, or chunks) whose revision
		// was compacted between them: a first page has no cursor to expire
		page, err = s.readPage(rctx, from, base+prefix, prefixEnd(base+prefix), 0, int64(limit))
	}
	if err != nil {
		if errors.Is(err, rpctypes.ErrCompacted) {
			return authority.ScanResult{Kind: authority.KindScanExpired}, 0, nil
		}
		if errors.Is(err, rpctypes.ErrFutureRev) {
			return authority.ScanResult{}, 0, authority.Invalid("Authority scan cursor is invalid.")
		}
		return authority.ScanResult{}, 0, mapError(err, false)
	}
	now := s.clock.Now()
	out := authority.ScanResult{Kind: authority.KindPage, Items: make([]authority.ScanItem, 0, len(page.Kvs))}
	for _, kv := range page.Kvs {
		key := authority.Key(strings.TrimPrefix(string(kv.Key), base))
		r, err := s.decodeRow(key, kv)
		if err != nil {
			return authority.ScanResult{}, 0, err
		}
		out.Items = append(out.Items, authority.ScanItem{Key: key, Snapshot: r.Snapshot(now)})
	}
	if page.More && len(out.Items) > 0 {
		out.NextCursor = authority.EncodeScanCursor(authority.ScanPosition{
			Scope: s.keys.Namespace(), Prefix: prefix, Revision: page.Revision, After: out.Items[len(out.Items)-1].Key,
		})
	}
	return out, page.Revision, nil
}
