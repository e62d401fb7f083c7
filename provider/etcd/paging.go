package etcd

import (
	"context"
	"errors"
	"math"

	"github.com/zlink-systems/authority/internal/etcdpage"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// prefixEnd returns the end of the range of keys starting with prefix.
func prefixEnd(prefix string) string { return clientv3.GetPrefixRangeEnd(prefix) }

// readPage reads up to limit keys of [from, end) at rev (0: now) for a
// listing page; floor is the prefix every key of the range shares (from is
// floor on a first page, else just past the cursor's key).
//
// etcd answers a Range with a limit after walking every key to the range's
// end to count them, so a page read as one ranged Get costs the rows after
// it (152 ms at 1M rows, 35 ms at 100k) and a listing is quadratic in its
// rows (docs/scale.md). A page after a cursor reads in windows around the
// cursor (etcdpage.ReadAfter): etcd counts the smallest window that holds
// the page. A first page has no such window: it streams the range
// (etcdpage.Stream, etcd 3.7's RangeStream, which does not count), and on a
// server without it (remembered) or for a chunk over the client's receive
// limit reads it as one ranged Get.
func (s *Store) readPage(ctx context.Context, from, floor, end string, rev, limit int64, opts ...clientv3.OpOption) (etcdpage.Page, error) {
	if from == floor {
		if p, ok, err := s.stream(ctx, from, end, rev, limit, opts...); ok {
			return p, err
		}
	}
	return etcdpage.ReadAfter(ctx, s.kv, from, floor, end, rev, limit, opts...)
}

// stream reads up to limit keys of [from, end) at rev through etcdpage.Stream.
// ok is false when the caller must read them another way: the server has no
// RangeStream (remembered in s.noStream), or a chunk was over the client's
// receive limit.
func (s *Store) stream(ctx context.Context, from, end string, rev, limit int64, opts ...clientv3.OpOption) (p etcdpage.Page, ok bool, err error) {
	if s.noStream.Load() {
		return etcdpage.Page{}, false, nil
	}
	p, err = etcdpage.Stream(ctx, s.kv, from, end, rev, limit, opts...)
	switch {
	case errors.Is(err, etcdpage.ErrNoStream):
		s.noStream.Store(true)
		return etcdpage.Page{}, false, nil
	case err != nil && etcdpage.TooLarge(err):
		return etcdpage.Page{}, false, nil
	}
	return p, true, err
}

// readRest reads every key after last up to end at rev: the rest of a range
// a Txn read with a limit (a node's capacity entries past the first page).
// Streamed, it costs the keys read; with etcdpage.Rest (a server without
// RangeStream, or a chunk over the client's receive limit) each page also
// walks the keys after it, as readPage explains.
func (s *Store) readRest(ctx context.Context, last, end string, rev, pageSize int64) ([]*mvccpb.KeyValue, error) {
	if p, ok, err := s.stream(ctx, last+"\x00", end, rev, math.MaxInt64); ok {
		return p.Kvs, err
	}
	return etcdpage.Rest(ctx, s.kv, last, end, rev, pageSize)
}

// scanPage reads up to limit keys of [from, end), as they are now, for a
// walk of a whole range whose every key is then fenced by its own
// ModRevision (an owner's index, removed or rebound): no page needs the
// revision of the one before. Every page is streamed (etcdpage.Scan), so a
// page costs its own keys whatever the keys after it and however its keys
// are shaped: windows around a cursor (a listing's later pages) count most
// of the range when keys share no structure (random IDs), which made such a
// walk quadratic again. On a server without RangeStream (or for a chunk
// over the client's receive limit) it reads in windows after from as a
// listing does (floor is the prefix every key of the range shares).
func (s *Store) scanPage(ctx context.Context, from, floor, end string, limit int64, opts ...clientv3.OpOption) (etcdpage.Page, error) {
	if !s.noStream.Load() {
		p, err := etcdpage.Scan(ctx, s.kv, from, end, limit, opts...)
		switch {
		case errors.Is(err, etcdpage.ErrNoStream):
			s.noStream.Store(true)
		case err != nil && etcdpage.TooLarge(err):
		default:
			return p, err
		}
	}
	return etcdpage.ReadAfter(ctx, s.kv, from, floor, end, 0, limit, opts...)
}
