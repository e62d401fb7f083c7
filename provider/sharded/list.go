package sharded

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	authority "github.com/zlink-systems/authority"
)

// Listing across shards. A page asks every shard that may still hold rows
// for limit rows after the last key returned, each at its own revision (the
// revision its first page was read at), and returns the first limit of their
// merge in key order. The cursor carries that last key and, per shard, its
// revision or that it is done: a vector of per-shard cursors inside the
// contract's cursor (authority.EncodeScanCursor), its Scope naming the
// shard map. Each shard's part of the listing is a consistent snapshot of
// that shard, or the listing ends with KindScanExpired when a shard
// compacted past its revision. Across shards the snapshots are taken each
// at its own revision, during the first page's call (docs/deviations.md D2).

// shardDone marks, in a cursor, a shard whose rows under the prefix were all
// returned.
const shardDone = -1

// listCursor is what a sharded listing's cursor carries besides the prefix.
type listCursor struct {
	after authority.Key
	revs  []int64 // per shard: its listing's revision, or shardDone
}

// cursorScope is the Scope of the store's cursors: the map's epoch and its
// clusters, so a cursor of another map is refused.
func (s *Store) cursorScope() string {
	var b strings.Builder
	fmt.Fprintf(&b, "sharded/e%d", s.smap.Epoch)
	for _, sh := range s.smap.Shards {
		b.WriteString("/" + sh.ClusterID + sh.Namespace)
	}
	return b.String()
}

func (s *Store) encodeCursor(prefix string, c listCursor) authority.ScanCursor {
	parts := make([]string, len(c.revs))
	var sum int64
	for i, r := range c.revs {
		parts[i] = strconv.FormatInt(r, 10)
		sum += max(r, 0)
	}
	return authority.EncodeScanCursor(authority.ScanPosition{
		Scope: s.cursorScope() + "|" + strings.Join(parts, ","), Prefix: prefix, Revision: sum, After: c.after,
	})
}

func (s *Store) decodeCursor(prefix string, cursor authority.ScanCursor) (listCursor, error) {
	p, err := authority.ParseScanCursor(cursor)
	if err != nil {
		return listCursor{}, err
	}
	cut := strings.LastIndexByte(p.Scope, '|')
	if cut < 0 || p.Scope[:cut] != s.cursorScope() || p.Prefix != prefix {
		return listCursor{}, authority.Invalid("Authority scan cursor was made for another listing.")
	}
	invalid := authority.Invalid("Authority scan cursor is invalid.")
	parts := strings.Split(p.Scope[cut+1:], ",")
	if len(parts) != len(s.shards) {
		return listCursor{}, invalid
	}
	c := listCursor{after: p.After, revs: make([]int64, len(parts))}
	open := false
	for i, part := range parts {
		r, err := strconv.ParseInt(part, 10, 64)
		if err != nil || r != shardDone && r < 1 || strconv.FormatInt(r, 10) != part {
			return listCursor{}, invalid
		}
		c.revs[i], open = r, open || r != shardDone
	}
	if !open {
		return listCursor{}, invalid
	}
	return c, nil
}

// shardPage is one shard's part of a listing page.
type shardPage struct {
	res  authority.ScanResult
	rev  int64
	more bool
}

// ListAuthorities lists the rows whose key starts with prefix, in key
// order across every shard, limit at a time, with one cursor.
func (s *Store) ListAuthorities(ctx context.Context, prefix string, cursor authority.ScanCursor, limit int) (authority.ScanResult, error) {
	if err := authority.ValidateScanLimit(limit); err != nil {
		return authority.ScanResult{}, err
	}
	if err := authority.ValidateScanPrefix(prefix); err != nil {
		return authority.ScanResult{}, err
	}
	c := listCursor{revs: make([]int64, len(s.shards))}
	if cursor != "" {
		var err error
		if c, err = s.decodeCursor(prefix, cursor); err != nil {
			return authority.ScanResult{}, err
		}
	}
	if err := s.begin(ctx); err != nil {
		return authority.ScanResult{}, err
	}
	var active []int
	for i, r := range c.revs {
		if r != shardDone {
			active = append(active, i)
		}
	}
	pages := make([]shardPage, len(s.shards))
	err := s.eachOf(ctx, active, func(ctx context.Context, i int, sh *shard) error {
		res, rev, err := sh.store.ListPageAt(ctx, prefix, c.after, c.revs[i], limit)
		if err == nil {
			err = s.num.items(i, res.Items)
		}
		pages[i] = shardPage{res: res, rev: rev, more: res.NextCursor != ""}
		return err
	})
	if err != nil {
		return authority.ScanResult{}, err
	}
	for _, i := range active {
		if pages[i].res.Kind == authority.KindScanExpired {
			return authority.ScanResult{Kind: authority.KindScanExpired}, nil
		}
	}
	return s.merge(prefix, c, active, pages, limit), nil
}

// merge returns the first limit rows of the shards' pages in key order, and
// the cursor continuing after them.
func (s *Store) merge(prefix string, c listCursor, active []int, pages []shardPage, limit int) authority.ScanResult {
	out := authority.ScanResult{Kind: authority.KindPage}
	taken := make([]int, len(s.shards))
	for len(out.Items) < limit {
		best := -1
		for _, i := range active {
			items := pages[i].res.Items
			if taken[i] < len(items) && (best < 0 || items[taken[i]].Key < pages[best].res.Items[taken[best]].Key) {
				best = i
			}
		}
		if best < 0 {
			break
		}
		out.Items = append(out.Items, pages[best].res.Items[taken[best]])
		taken[best]++
	}
	next := listCursor{revs: make([]int64, len(s.shards))}
	open := false
	for i := range next.revs {
		next.revs[i] = shardDone
	}
	for _, i := range active {
		if pages[i].more || taken[i] < len(pages[i].res.Items) {
			next.revs[i], open = pages[i].rev, true
		}
	}
	if open && len(out.Items) > 0 {
		next.after = out.Items[len(out.Items)-1].Key
		out.NextCursor = s.encodeCursor(prefix, next)
	}
	return out
}
