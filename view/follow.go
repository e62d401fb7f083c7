package view

import (
	"errors"
	"time"

	authority "github.com/zlink-systems/authority"
)

// follower applies a view's feeds. It owns work, the tree the view's
// published state copies (copy-on-write) after each applied batch, and
// staging, the listing a listing feed is collecting.
type follower struct {
	v       *View
	work    *tree
	staging *tree
	// listing is set while the current feed is a listing whose FeedSynced
	// has not come: if it fails, the view lists again (resuming after the
	// revision it applied would skip the rows the listing did not deliver).
	listing bool
}

// follow applies the feed's batches until the view closes. A feed whose
// history is gone, or that fails before its listing ends, is replaced by a
// listing one; a feed that fails otherwise is resumed after the applied
// revision.
func (v *View) follow(feed authority.Feed) {
	defer v.wg.Done()
	fl := &follower{v: v, work: newTree(), listing: true}
	for {
		b, err := feed.Next(v.life)
		if err == nil {
			fl.apply(b)
			continue
		}
		_ = feed.Close()
		if v.life.Err() != nil {
			return
		}
		relist := fl.listing || errors.Is(err, authority.ErrFeedCompacted)
		fl.staging = nil
		if feed = v.reopen(relist); feed == nil {
			return
		}
		fl.listing = relist
	}
}

// reopen opens the feed that follows one that ended: a listing one when
// relist is set, else one resuming after the applied revision, retrying
// (with a backoff) until one opens or the view closes (nil).
func (v *View) reopen(relist bool) authority.Feed {
	backoff := 10 * time.Millisecond
	for {
		req := authority.FeedRequest{Prefix: v.prefix, List: true}
		if relist {
			v.relists.Add(1)
		} else {
			req = authority.FeedRequest{Prefix: v.prefix, After: v.Revision()}
			if pos := v.cur.Load().pos; pos != nil {
				req = authority.FeedRequest{Prefix: v.prefix, AfterPosition: pos.Clone()}
			}
			v.resumes.Add(1)
		}
		feed, err := v.store.WatchRows(v.life, req)
		if err == nil {
			v.feedMu.Lock()
			v.feed, v.askedRev = feed, 0
			v.feedMu.Unlock()
			return feed
		}
		if v.life.Err() != nil || errors.Is(err, authority.ErrClosed) {
			v.fail(authority.ErrClosed)
			return nil
		}
		// a resume refused for compaction lists again
		relist = relist || errors.Is(err, authority.ErrFeedCompacted)
		select {
		case <-v.life.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// apply applies one batch; a listing collects into staging until its
// FeedSynced swaps it in. Each batch that moves the view publishes a new
// state.
func (fl *follower) apply(b authority.FeedBatch) {
	v := fl.v
	cur := v.cur.Load()
	switch b.Kind {
	case authority.FeedListed:
		if fl.staging == nil {
			fl.staging = newTree()
		}
		for _, ev := range b.Events {
			fl.staging.Set(entry{key: ev.Key, snap: ev.Snapshot})
		}
		return
	case authority.FeedSynced:
		if fl.staging == nil {
			fl.staging = newTree()
		}
		fl.work, fl.staging, fl.listing = fl.staging, nil, false
		v.publish(&state{rows: fl.work.Copy(), applied: max(cur.applied, b.Revision), pos: later(cur.pos, b.Position)})
		v.syncedOnce.Do(func() { close(v.synced) })
		return
	}
	rows := cur.rows
	if len(b.Events) > 0 {
		for _, ev := range b.Events {
			if ev.Kind == authority.FeedRemoved {
				fl.work.Delete(entry{key: ev.Key})
			} else {
				fl.work.Set(entry{key: ev.Key, snap: ev.Snapshot})
			}
		}
		rows = fl.work.Copy()
	}
	v.publish(&state{rows: rows, applied: max(cur.applied, b.Revision), pos: later(cur.pos, b.Position)})
}

// later returns the position a batch at b moves the view to from a: b's,
// at least a's in every sequence (a feed after a relist starts where the
// store was, which is no earlier).
func later(a, b authority.FeedPosition) authority.FeedPosition {
	if b == nil {
		return a
	}
	out := b.Clone()
	if len(a) == len(b) {
		for i := range out {
			out[i] = max(out[i], a[i])
		}
	}
	return out
}

// publish makes st the view's state and wakes the waiters.
func (v *View) publish(st *state) {
	v.cur.Store(st)
	v.mu.Lock()
	v.signal()
	v.mu.Unlock()
}
