package view

import (
	"context"
	"strings"
	"time"

	authority "github.com/zlink-systems/authority"
)

// A listing's pages all reflect the revision of its first page: when a
// first page has more to come, the view pins an O(1) copy-on-write copy of
// its rows at that revision, which the cursor names. A pin lasts pinTTL and
// at most maxPins are kept; a continuation whose pin is gone reports
// KindScanExpired, as the store's would after a compaction.

const (
	maxPins = 16
	pinTTL  = 5 * time.Minute
)

// pin is the rows at a revision (a published state's tree, never
// changed).
type pin struct {
	rev  int64
	tree *tree
	at   time.Time
}

// ListAuthorities lists the rows under prefix consistently
// (authority.AuthorityStore semantics): List with the zero Freshness.
func (v *View) ListAuthorities(ctx context.Context, prefix string, cursor authority.ScanCursor, limit int) (authority.ScanResult, error) {
	p, err := v.List(ctx, prefix, cursor, limit, Freshness{})
	return p.ScanResult, err
}

// List returns one page of the rows under prefix (which must be under the
// view's prefix), as fresh as f asks for a first page; a continuation
// reflects its first page's revision. A listing the view handed to the
// store continues there.
func (v *View) List(ctx context.Context, prefix string, cursor authority.ScanCursor, limit int, f Freshness) (Page, error) {
	if err := authority.ValidateScanLimit(limit); err != nil {
		return Page{}, err
	}
	if strings.IndexByte(prefix, 0) >= 0 || !strings.HasPrefix(prefix, v.prefix) {
		return Page{}, authority.Invalid("Scan prefix " + prefix + " is not under the view's prefix " + v.prefix + ".")
	}
	if cursor != "" {
		pos, err := authority.ParseScanCursor(cursor)
		if err != nil {
			return Page{}, err
		}
		if pos.Scope != v.scope {
			res, err := v.store.ListAuthorities(ctx, prefix, cursor, limit)
			return Page{ScanResult: res, Revision: pos.Revision, FromStore: true}, err
		}
		if _, err := authority.DecodeScanCursor(cursor, v.scope, prefix); err != nil {
			return Page{}, err
		}
		return v.continueList(pos, limit), nil
	}
	st, _, rev, fromStore, err := v.ready(ctx, f)
	if err != nil {
		return Page{}, err
	}
	if fromStore {
		v.storeReads.Add(1)
		res, err := v.store.ListAuthorities(ctx, prefix, "", limit)
		if err == nil && res.NextCursor != "" {
			// the store's pages all reflect the revision its cursor names
			if pos, perr := authority.ParseScanCursor(res.NextCursor); perr == nil && pos.Revision > 0 {
				rev = pos.Revision
			}
		}
		return Page{ScanResult: res, Revision: rev, FromStore: true}, err
	}
	items, more := v.page(st.rows, prefix, authority.Key(prefix), false, limit)
	if more {
		v.pinTree(st)
	}
	return v.finish(items, more, prefix, st.applied), nil
}

// continueList reads the page after pos from its pinned copy.
func (v *View) continueList(pos authority.ScanPosition, limit int) Page {
	v.pinMu.Lock()
	defer v.pinMu.Unlock()
	v.dropPins()
	for _, p := range v.pins {
		if p.rev == pos.Revision {
			items, more := v.page(p.tree, pos.Prefix, pos.After, true, limit)
			return v.finish(items, more, pos.Prefix, pos.Revision)
		}
	}
	return Page{ScanResult: authority.ScanResult{Kind: authority.KindScanExpired}, Revision: pos.Revision}
}

// page collects up to limit entries under prefix from from (after it when
// after is set); more says whether others follow.
func (v *View) page(rows *tree, prefix string, from authority.Key, after bool, limit int) ([]entry, bool) {
	out := make([]entry, 0, min(limit, rows.Len()))
	more := false
	rows.Ascend(entry{key: from}, func(e entry) bool {
		if after && e.key == from {
			return true
		}
		if !strings.HasPrefix(string(e.key), prefix) {
			return false
		}
		if len(out) == limit {
			more = true
			return false
		}
		out = append(out, e)
		return true
	})
	return out, more
}

// finish makes the page's answer: copies of the rows, and a cursor when
// more follow.
func (v *View) finish(items []entry, more bool, prefix string, rev int64) Page {
	res := authority.ScanResult{Kind: authority.KindPage, Items: copyRows(items, v.clock.Now())}
	if more && len(items) > 0 {
		res.NextCursor = authority.EncodeScanCursor(authority.ScanPosition{
			Scope: v.scope, Prefix: prefix, Revision: rev, After: items[len(items)-1].key,
		})
	}
	return Page{ScanResult: res, Revision: rev}
}

// pinTree pins st's rows at its revision, unless they are.
func (v *View) pinTree(st *state) {
	v.pinMu.Lock()
	defer v.pinMu.Unlock()
	v.dropPins()
	for _, p := range v.pins {
		if p.rev == st.applied {
			return
		}
	}
	if len(v.pins) == maxPins {
		v.pins = v.pins[1:]
	}
	v.pins = append(v.pins, pin{rev: st.applied, tree: st.rows, at: time.Now()})
}

// dropPins drops the pins older than pinTTL. The caller holds v.pinMu.
func (v *View) dropPins() {
	for len(v.pins) > 0 && time.Since(v.pins[0].at) > pinTTL {
		v.pins = v.pins[1:]
	}
}

// copyRows returns caller-owned copies of the rows, stamped with now, in a
// few allocations per page rather than a few per row: the snapshots, their
// Spot types and pending creations, and their bytes each share one slab.
func copyRows(items []entry, now time.Time) []authority.ScanItem {
	var nbytes, npending, nspot int
	for _, e := range items {
		nbytes += len(e.snap.Payload)
		if p := e.snap.PendingCreation; p != nil {
			npending++
			nbytes += len(p.RequestSHA256)
		}
		if e.snap.Allocation.Capacity.SpotType != nil {
			nspot++
		}
	}
	out := make([]authority.ScanItem, len(items))
	snaps := make([]authority.Snapshot, len(items))
	pendings := make([]authority.PendingCreation, npending)
	spots := make([]authority.SpotTypeCapacity, nspot)
	buf := make([]byte, nbytes)
	take := func(b []byte) []byte {
		if b == nil {
			return nil
		}
		n := copy(buf, b)
		c := buf[:n:n]
		buf = buf[n:]
		return c
	}
	for i, e := range items {
		s := &snaps[i]
		*s = *e.snap
		s.StoreNow = now
		s.Payload = take(e.snap.Payload)
		if st := e.snap.Allocation.Capacity.SpotType; st != nil {
			spots[0] = *st
			s.Allocation.Capacity.SpotType = &spots[0]
			spots = spots[1:]
		}
		if p := e.snap.PendingCreation; p != nil {
			pendings[0] = *p
			pendings[0].RequestSHA256 = take(p.RequestSHA256)
			s.PendingCreation = &pendings[0]
			pendings = pendings[1:]
		}
		out[i] = authority.ScanItem{Key: e.key, Snapshot: s}
	}
	return out
}
