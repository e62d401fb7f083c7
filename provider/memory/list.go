package memory

import (
	"context"
	"sort"
	"strings"
	"time"

	"github.com/tidwall/btree"

	authority "github.com/zlink-systems/authority"
)

// A listing reads the index as it was at its first page. When a first page
// has more to come, the store pins a copy of the index at the current
// revision (an O(1) copy-on-write copy of the B-tree, shared by every
// listing started at that revision), and the cursor names the revision and
// the last key returned. A continuation reads the pinned copy, so writes
// after the first page never tear a listing; once the copy is dropped (after
// ScanRetention, beyond MaxPinnedScans, or by ExpireScans) the continuation
// reports KindScanExpired.

// pin is a copy of the index at a revision.
type pin struct {
	revision int64
	tree     *btree.BTreeG[*row]
	pinnedAt time.Time
}

// listAuthorities lists the rows whose key starts with prefix, in byte order
// of their keys, limit at a time.
func (s *Store) listAuthorities(ctx context.Context, prefix string, cursor authority.ScanCursor, limit int) (authority.ScanResult, error) {
	if err := authority.ValidateScanLimit(limit); err != nil {
		return authority.ScanResult{}, err
	}
	var pos authority.ScanPosition
	if cursor != "" {
		var err error
		if pos, err = authority.DecodeScanCursor(cursor, s.scope, prefix); err != nil {
			return authority.ScanResult{}, err
		}
	}
	now, err := s.lock(ctx)
	if err != nil {
		return authority.ScanResult{}, err
	}
	s.dropExpiredPins(now)
	tree, revision := s.index, s.revision
	if cursor != "" {
		tree = s.pinned(pos.Revision)
		if tree == nil {
			s.mu.Unlock()
			return authority.ScanResult{Kind: authority.KindScanExpired}, nil
		}
		revision = pos.Revision
	}
	rows := make([]*row, 0, min(limit+1, max(tree.Len(), 1)))
	pivot := &row{key: authority.Key(prefix)}
	if cursor != "" {
		pivot.key = pos.After
	}
	// The pivot has the prefix, so the keys with the prefix are one run
	// from it: collect limit+1 rows without reading their keys, then cut the
	// run's end by a binary search. A continuation skips After itself, the
	// first row at or after the pivot if it is there.
	first := true
	tree.Ascend(pivot, func(r *row) bool {
		if first {
			first = false
			if cursor != "" && r.key == pos.After {
				return true
			}
		}
		rows = append(rows, r)
		return len(rows) <= limit
	})
	rows = rows[:sort.Search(len(rows), func(i int) bool {
		return !strings.HasPrefix(string(rows[i].key), prefix)
	})]
	more := len(rows) > limit
	if more {
		rows = rows[:limit]
		if cursor == "" {
			s.pin(revision, now)
		}
	}
	// Copy the rows outside the lock; while copying counts this listing,
	// writes store successors instead of rewriting rows in place.
	s.copying++
	s.mu.Unlock()
	items := page(rows, now)
	s.mu.Lock()
	s.copying--
	s.mu.Unlock()
	result := authority.ScanResult{Kind: authority.KindPage, Items: items}
	if more {
		result.NextCursor = authority.EncodeScanCursor(authority.ScanPosition{
			Scope: s.scope, Prefix: prefix, Revision: revision, After: rows[len(rows)-1].key,
		})
	}
	return result, nil
}

// ExpireScans drops every pinned listing and the row feed's log, as an
// etcd compaction at the current revision does: every cursor handed out so
// far reports KindScanExpired, and every feed behind the current revision
// authority.ErrFeedCompacted.
func (s *Store) ExpireScans() {
	s.mu.Lock()
	clear(s.pins)
	s.pins = s.pins[:0]
	s.feed.expire(s.revision)
	s.mu.Unlock()
}

// pinned returns the index pinned at revision, or nil.
func (s *Store) pinned(revision int64) *btree.BTreeG[*row] {
	for i := range s.pins {
		if s.pins[i].revision == revision {
			return s.pins[i].tree
		}
	}
	return nil
}

// pin keeps a copy of the index at revision (the current one), unless one is
// already kept, dropping the oldest beyond maxPins.
func (s *Store) pin(revision int64, now time.Time) {
	if s.pinned(revision) != nil {
		return
	}
	if len(s.pins) >= s.maxPins {
		n := copy(s.pins, s.pins[1:])
		s.pins[n] = pin{}
		s.pins = s.pins[:n]
	}
	s.pins = append(s.pins, pin{revision: revision, tree: s.index.Copy(), pinnedAt: now})
}

// dropExpiredPins drops the pins older than scanRetention. Pins are kept in
// the order they were made.
func (s *Store) dropExpiredPins(now time.Time) {
	n := 0
	for n < len(s.pins) && !s.pins[n].pinnedAt.Add(s.scanRetention).After(now) {
		n++
	}
	if n > 0 {
		m := copy(s.pins, s.pins[n:])
		clear(s.pins[m:])
		s.pins = s.pins[:m]
	}
}

// page copies rows into scan items in one pass over the rows (each row is
// read once, while it is in the cache): one allocation holds every snapshot,
// and the Spot types, pending creations and bytes are carved from slabs.
func page(rows []*row, now time.Time) []authority.ScanItem {
	items := make([]authority.ScanItem, len(rows))
	snaps := make([]authority.Snapshot, len(rows))
	var st []authority.SpotTypeCapacity
	var pc []authority.PendingCreation
	var arena []byte
	for i, r := range rows {
		var stp *authority.SpotTypeCapacity
		if r.snap.Allocation.Capacity.SpotType != nil {
			if len(st) == 0 {
				st = make([]authority.SpotTypeCapacity, len(rows)-i)
			}
			stp, st = &st[0], st[1:]
		}
		var pcp *authority.PendingCreation
		if r.snap.PendingCreation != nil {
			if len(pc) == 0 {
				pc = make([]authority.PendingCreation, min(len(rows)-i, 64))
			}
			pcp, pc = &pc[0], pc[1:]
		}
		n := r.exportSize()
		if len(arena) < n {
			arena = make([]byte, max(n, arenaChunk))
		}
		r.exportInto(&snaps[i], stp, pcp, arena[:n:n], now)
		arena = arena[n:]
		items[i] = authority.ScanItem{Key: r.key, Snapshot: &snaps[i]}
	}
	return items
}

// arenaChunk is the size of the slabs a page carves its bytes from.
const arenaChunk = 16 << 10
