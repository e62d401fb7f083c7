package etcd

import (
	"context"
	"errors"
	"math"

	"github.com/zlink-systems/authority/internal/etcdpage"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// readPage reads up to limit keys of [from, end) at rev (0: now) for a
// listing page; floor is the prefix every key of the range shares. It
// streams the range (etcdpage.Stream) so that the page costs its own keys:
// a Range with a limit makes etcd walk every key after the page to count the
// range, so a 1000-row page cost the rows after it (152 ms at 1M rows, 35 ms
// at 100k) and a listing was quadratic in the rows listed (docs/scale.md).
// On a server without RangeStream (etcd before 3.7; remembered) and for a
// chunk over the client's receive limit, it reads in windows
// (etcdpage.ReadAfter), which split what is too large and bound the count to
// the smallest window around the page.
func (s *Store) readPage(ctx context.Context, from, floor, end string, rev, limit int64, opts ...clientv3.OpOption) (etcdpage.Page, error) {
	if !s.noStream.Load() {
		p, err := etcdpage.Stream(ctx, s.kv, from, end, rev, limit, opts...)
		switch {
		case errors.Is(err, etcdpage.ErrNoStream):
			s.noStream.Store(true)
		case err == nil || !etcdpage.TooLarge(err):
			return p, err
		}
	}
	return etcdpage.ReadAfter(ctx, s.kv, from, floor, end, rev, limit, opts...)
}

// readRest reads every key after last up to end at rev: the rest of a range
// a Txn read with a limit (a node's capacity entries past the first page).
// Streamed, it costs the keys read; with etcdpage.Rest (a server without
// RangeStream, or a chunk over the client's receive limit) each page also
// walks the keys after it, as readPage explains.
func (s *Store) readRest(ctx context.Context, last, end string, rev, pageSize int64) ([]*mvccpb.KeyValue, error) {
	if !s.noStream.Load() {
		p, err := etcdpage.Stream(ctx, s.kv, last+"\x00", end, rev, math.MaxInt64)
		switch {
		case errors.Is(err, etcdpage.ErrNoStream):
			s.noStream.Store(true)
		case err == nil || !etcdpage.TooLarge(err):
			return p.Kvs, err
		}
	}
	return etcdpage.Rest(ctx, s.kv, last, end, rev, pageSize)
}
