package view

import (
	"errors"
	"time"

	"github.com/tidwall/btree"

	authority "github.com/zlink-systems/authority"
)

// follow applies the feed's batches until the view closes. A feed whose
// history is gone is replaced by a relisting one; a feed that fails
// otherwise is resumed after the applied revision.
func (v *View) follow(feed authority.Feed) {
	defer v.wg.Done()
	var staging *btree.BTreeG[*entry]
	for {
		b, err := feed.Next(v.life)
		if err == nil {
			staging = v.apply(b, staging)
			continue
		}
		_ = feed.Close()
		if v.life.Err() != nil {
			return
		}
		staging = nil
		if feed = v.reopen(err); feed == nil {
			return
		}
	}
}

// reopen opens the feed that follows one that ended with cause: a relisting
// one after ErrFeedCompacted, else one resuming after the applied revision,
// retrying (with a backoff) until one opens or the view closes (nil).
func (v *View) reopen(cause error) authority.Feed {
	backoff := 10 * time.Millisecond
	for {
		req := authority.FeedRequest{Prefix: v.prefix, List: true}
		if !errors.Is(cause, authority.ErrFeedCompacted) {
			req = authority.FeedRequest{Prefix: v.prefix, After: v.Revision()}
			v.resumes.Add(1)
		} else {
			v.relists.Add(1)
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
		cause = err
		select {
		case <-v.life.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// fail ends the view's reads with err.
func (v *View) fail(err error) {
	v.mu.Lock()
	if v.err == nil {
		v.err = err
	}
	v.signal()
	v.mu.Unlock()
}

// apply applies one batch; a listing collects into staging until its
// FeedSynced swaps it in.
func (v *View) apply(b authority.FeedBatch, staging *btree.BTreeG[*entry]) *btree.BTreeG[*entry] {
	switch b.Kind {
	case authority.FeedListed:
		if staging == nil {
			staging = btree.NewBTreeGOptions(entryLess, btree.Options{NoLocks: true})
		}
		for _, ev := range b.Events {
			staging.Set(&entry{key: ev.Key, snap: ev.Snapshot})
		}
		return staging
	case authority.FeedSynced:
		if staging == nil {
			staging = btree.NewBTreeGOptions(entryLess, btree.Options{NoLocks: true})
		}
		v.mu.Lock()
		v.rows, v.applied = staging, max(v.applied, b.Revision)
		v.signal()
		v.mu.Unlock()
		return nil
	}
	v.mu.Lock()
	for _, ev := range b.Events {
		if ev.Kind == authority.FeedRemoved {
			v.rows.Delete(&entry{key: ev.Key})
		} else {
			v.rows.Set(&entry{key: ev.Key, snap: ev.Snapshot})
		}
	}
	v.applied = max(v.applied, b.Revision)
	v.signal()
	v.mu.Unlock()
	return staging
}
