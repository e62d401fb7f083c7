package sharded

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/provider/etcd/schema"
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

// cursorScope is the Scope of the cursors of map m: its epoch and its
// clusters, so a cursor of another map is refused (one of an earlier epoch
// of the same shards has expired: a resharding switched under it).
func cursorScope(m schema.ShardMap) string {
	var b strings.Builder
	fmt.Fprintf(&b, "sharded/e%d", m.Epoch)
	for _, sh := range m.Shards {
		b.WriteString("/" + sh.ClusterID + sh.Namespace)
	}
	return b.String()
}

// errCursorExpired is a cursor of an earlier map of the store's shards.
var errCursorExpired = errors.New("the listing's shard map is no longer in force")

func (t *topology) encodeCursor(prefix string, c listCursor) authority.ScanCursor {
	parts := make([]string, len(c.revs))
	var sum int64
	for i, r := range c.revs {
		parts[i] = strconv.FormatInt(r, 10)
		sum += max(r, 0)
	}
	return authority.EncodeScanCursor(authority.ScanPosition{
		Scope: cursorScope(t.smap) + "|" + strings.Join(parts, ","), Prefix: prefix, Revision: sum, After: c.after,
	})
}

func (t *topology) decodeCursor(prefix string, cursor authority.ScanCursor) (listCursor, error) {
	p, err := authority.ParseScanCursor(cursor)
	if err != nil {
		return listCursor{}, err
	}
	cut := strings.LastIndexByte(p.Scope, '|')
	if cut >= 0 && p.Prefix == prefix && p.Scope[:cut] != cursorScope(t.smap) && t.earlier(p.Scope[:cut]) {
		return listCursor{}, errCursorExpired
	}
	if cut < 0 || p.Scope[:cut] != cursorScope(t.smap) || p.Prefix != prefix {
		return listCursor{}, authority.Invalid("Authority scan cursor was made for another listing.")
	}
	invalid := authority.Invalid("Authority scan cursor is invalid.")
	parts := strings.Split(p.Scope[cut+1:], ",")
	if len(parts) != len(t.shards) {
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

// earlier reports whether scope is the cursor scope of an earlier map of
// t's: an earlier epoch whose shards are t's first ones.
func (t *topology) earlier(scope string) bool {
	for e := t.smap.Epoch - 1; e >= 1; e-- {
		for n := len(t.smap.Shards); n >= 1; n-- {
			m := schema.ShardMap{Epoch: e, Shards: t.smap.Shards[:n]}
			if cursorScope(m) == scope {
				return true
			}
		}
	}
	return false
}

// shardPage is one shard's part of a listing page.
type shardPage struct {
	res  authority.ScanResult
	rev  int64
	more bool
}

// ListAuthorities lists the rows whose key starts with prefix, in key
// order across every shard, limit at a time, with one cursor. A shard's
// rows are the keys it holds that the map in force places in it (a
// resharding's copies, and the rows it moved away until it deleted them,
// are not listed twice). A cursor of a map that a resharding replaced has
// expired (KindScanExpired).
func (s *Store) ListAuthorities(ctx context.Context, prefix string, cursor authority.ScanCursor, limit int) (authority.ScanResult, error) {
	if err := authority.ValidateScanLimit(limit); err != nil {
		return authority.ScanResult{}, err
	}
	if err := authority.ValidateScanPrefix(prefix); err != nil {
		return authority.ScanResult{}, err
	}
	if err := s.begin(ctx); err != nil {
		return authority.ScanResult{}, err
	}
	var out authority.ScanResult
	err := s.rerouted(ctx, func(t *topology) (err error) {
		out, err = s.listAt(ctx, t, prefix, cursor, limit)
		return err
	})
	return out, err
}

// listAt lists a page under the map t.
func (s *Store) listAt(ctx context.Context, t *topology, prefix string, cursor authority.ScanCursor, limit int) (authority.ScanResult, error) {
	c := listCursor{revs: make([]int64, len(t.shards))}
	if cursor != "" {
		var err error
		if c, err = t.decodeCursor(prefix, cursor); errors.Is(err, errCursorExpired) {
			return authority.ScanResult{Kind: authority.KindScanExpired}, nil
		} else if err != nil {
			return authority.ScanResult{}, err
		}
	}
	for {
		res, skipped, err := s.pageAt(ctx, t, prefix, c, limit)
		if err != nil || len(res.Items) > 0 || skipped == nil {
			return res, err
		}
		c = *skipped // every row read was another shard's: read on
	}
}

// pageAt reads one page of the listing c continues. When every row read
// belongs to another shard (a resharding's copies or moved keys) but some
// shard has more, it returns no rows and the cursor after them (skipped).
func (s *Store) pageAt(ctx context.Context, t *topology, prefix string, c listCursor, limit int) (authority.ScanResult, *listCursor, error) {
	var active []int
	for i, r := range c.revs {
		if r != shardDone {
			active = append(active, i)
		}
	}
	pages := make([]shardPage, len(t.shards))
	err := s.eachOf(ctx, t, active, func(ctx context.Context, i int, sh *shard) error {
		res, rev, err := sh.store.ListPageAt(t.at(ctx, i), prefix, c.after, c.revs[i], limit)
		if err == nil {
			err = t.num.items(i, res.Items)
		}
		pages[i] = shardPage{res: res, rev: rev, more: res.NextCursor != ""}
		return err
	})
	if err != nil {
		return authority.ScanResult{}, nil, err
	}
	for _, i := range active {
		if pages[i].res.Kind == authority.KindScanExpired {
			return authority.ScanResult{Kind: authority.KindScanExpired}, nil, nil
		}
	}
	if c.after == "" { // a first page, read now: not behind a switch
		if err := t.checkSwitched(ctx); err != nil {
			return authority.ScanResult{}, nil, err
		}
	}
	res := t.merge(prefix, c, active, pages, limit)
	if len(res.Items) > 0 {
		return res, nil, nil
	}
	skipped := listCursor{revs: make([]int64, len(t.shards))}
	open := false
	for i := range skipped.revs {
		skipped.revs[i] = shardDone
	}
	for _, i := range active {
		if items := pages[i].res.Items; pages[i].more && len(items) > 0 {
			if last := items[len(items)-1].Key; !open || last < skipped.after {
				skipped.after = last
			}
			skipped.revs[i], open = pages[i].rev, true
		}
	}
	if !open {
		return res, nil, nil
	}
	return res, &skipped, nil
}

// merge returns the first limit rows of the shards' pages in key order, and
// the cursor continuing after them. A key a shard holds but does not own
// under the map is skipped.
func (t *topology) merge(prefix string, c listCursor, active []int, pages []shardPage, limit int) authority.ScanResult {
	out := authority.ScanResult{Kind: authority.KindPage}
	taken := make([]int, len(t.shards))
	next := func(i int) bool { // skips what shard i does not own
		items := pages[i].res.Items
		for taken[i] < len(items) && t.shardOf(items[taken[i]].Key) != i {
			taken[i]++
		}
		return taken[i] < len(items)
	}
	for len(out.Items) < limit {
		best := -1
		for _, i := range active {
			if next(i) && (best < 0 || pages[i].res.Items[taken[i]].Key < pages[best].res.Items[taken[best]].Key) {
				best = i
			}
		}
		if best < 0 {
			break
		}
		out.Items = append(out.Items, pages[best].res.Items[taken[best]])
		taken[best]++
	}
	cur := listCursor{revs: make([]int64, len(t.shards))}
	open := false
	for i := range cur.revs {
		cur.revs[i] = shardDone
	}
	for _, i := range active {
		if pages[i].more || taken[i] < len(pages[i].res.Items) {
			cur.revs[i], open = pages[i].rev, true
		}
	}
	if open && len(out.Items) > 0 {
		cur.after = out.Items[len(out.Items)-1].Key
		out.NextCursor = t.encodeCursor(prefix, cur)
	}
	return out
}
