package etcdpage

import (
	"context"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// ReadAfter reads up to limit keys of [from, end) at rev, as Read does, for
// a read that continues a listing: from is just past the last key read
// before (that key + "\x00"), and floor is the prefix every key of the range
// shares (end is usually its prefix end).
//
// etcd counts every key of a limited range up to the range's end (its Count
// field), so a plain read of the next page walks the whole rest of the range
// in etcd's index: a listing of n keys in pages of p costs n²/2p key visits
// (at a million keys, about 0.1 s a page). ReadAfter reads in windows
// instead, each the range of the keys that share a shorter prefix with
// from — from[:len(from)-1], then shorter — until the page is full or the
// window reaches end: a page costs the keys of the smallest such window that
// holds it. After a window that held no key the next one skips ahead by
// twice the depth reached so far (keys sharing a long prefix with from are
// then cheap to pass), after one that held keys it widens by one byte.
// Keys that share no structure (random IDs) gain little: the last window is
// then most of the range. More is exact: the page reads one key past limit.
func ReadAfter(ctx context.Context, kv clientv3.KV, from, floor, end string, rev int64, limit int64, opts ...clientv3.OpOption) (Page, error) {
	out := Page{Revision: rev}
	cur, k, step := from, len(from), 1
	for {
		k = max(k-step, len(floor))
		wEnd := windowEnd(from[:k], end)
		p, err := Read(ctx, kv, cur, wEnd, out.Revision, limit+1-int64(len(out.Kvs)), opts...)
		if err != nil {
			return Page{}, err
		}
		out.Revision = p.Revision
		out.Kvs = append(out.Kvs, p.Kvs...)
		if int64(len(out.Kvs)) > limit {
			out.Kvs, out.More = out.Kvs[:limit], true
			return out, nil
		}
		if wEnd == end || k == len(floor) {
			return out, nil
		}
		if step = 1; len(p.Kvs) == 0 {
			step = 2 * (len(from) - k + 1) // nothing here: widen faster
		}
		cur = wEnd
	}
}

// windowEnd is the end of the range of keys starting with prefix, but never
// past end (an empty end, or "\x00", means the end of the key space).
func windowEnd(prefix, end string) string {
	w := clientv3.GetPrefixRangeEnd(prefix)
	if w == "\x00" || (end != "\x00" && end != "" && w > end) {
		return end
	}
	return w
}
