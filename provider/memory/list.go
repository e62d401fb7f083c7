package memory

import (
	"context"
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

// ListAuthorities lists the rows whose key starts with prefix, in byte order
// of their keys, limit at a time (the seed's listAuthorities).
func (s *Store) ListAuthorities(ctx context.Context, prefix string, cursor authority.ScanCursor, limit int) (authority.ScanResult, error) {
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
	now, err := s.begin(ctx)
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
	tree.Ascend(pivot, func(r *row) bool {
		if !strings.HasPrefix(string(r.key), prefix) {
			return false
		}
		if cursor != "" && r.key == pos.After {
			return true
		}
		rows = append(rows, r)
		return len(rows) <= limit
	})
	more := len(rows) > limit
	if more {
		rows = rows[:limit]
		if cursor == "" {
			s.pin(revision, now)
		}
	}
	s.mu.Unlock()
	// Row values are immutable: copy them outside the lock.
	result := authority.ScanResult{Kind: authority.KindPage, Items: page(rows, now)}
	if more {
		result.NextCursor = authority.EncodeScanCursor(authority.ScanPosition{
			Scope: s.scope, Prefix: prefix, Revision: revision, After: rows[len(rows)-1].key,
		})
	}
	return result, nil
}

// ExpireScans drops every pinned listing: every cursor handed out so far
// reports KindScanExpired.
func (s *Store) ExpireScans() {
	s.mu.Lock()
	clear(s.pins)
	s.pins = s.pins[:0]
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

// page copies rows into scan items, with one allocation for all snapshots
// and one for all their bytes.
func page(rows []*row, now time.Time) []authority.ScanItem {
	items := make([]authority.ScanItem, len(rows))
	snaps := make([]exported, len(rows))
	size := 0
	for _, r := range rows {
		size += r.exportSize()
	}
	arena := make([]byte, size)
	for i, r := range rows {
		n := r.exportSize()
		r.exportInto(&snaps[i], arena[:n:n], now)
		arena = arena[n:]
		items[i] = authority.ScanItem{Key: r.key, Snapshot: &snaps[i].snap}
	}
	return items
}
