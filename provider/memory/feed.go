package memory

import (
	"context"
	"sort"
	"strings"
	"sync"

	authority "github.com/zlink-systems/authority"
)

// The row feed (authority.RowFeed).
//
// Every row write advances the store's revision (s.revision) by one. From the
// first WatchRows on, the store keeps a log of the row changes it commits,
// each with a copy of the row after it: the last Config.FeedRetention of
// them. A feed is a position in that log; Next reads the log after the
// position under the store's lock, so a feed starts no goroutine. A feed
// whose position falls before the log's start (it was too slow, or resumes
// from too long ago, or ExpireScans dropped the log) gets
// authority.ErrFeedCompacted.

// DefaultFeedRetention is how many row changes the feed log keeps when
// Config.FeedRetention is 0.
const DefaultFeedRetention = 1 << 16

// feedBatchMax bounds the events of one batch.
const feedBatchMax = 1000

// feedLog is the store's log of row changes. Its fields are under s.mu.
type feedLog struct {
	// on is set by the first WatchRows: only then are changes logged.
	on bool
	// start is the revision after which the log is complete: events holds
	// every change in (start, s.revision], in order.
	start  int64
	events []authority.FeedEvent
	// wake is closed (and cleared) when a change is logged or a progress
	// is requested; nil while nobody waits.
	wake chan struct{}
}

// record logs the change of r (nil: removed) at key, made at the store's
// current revision. The caller holds s.mu.
func (s *Store) record(kind authority.FeedEventKind, key authority.Key, r *row) {
	l := &s.feed
	if !l.on {
		return
	}
	ev := authority.FeedEvent{Kind: kind, Key: key, Revision: s.revision}
	if r != nil {
		ev.Snapshot = r.snapshot(s.epoch)
	}
	l.events = append(l.events, ev)
	if n := len(l.events); n > 2*s.feedRetention {
		drop := n - s.feedRetention
		l.start = l.events[drop-1].Revision
		l.events = append(l.events[:0:0], l.events[drop:]...)
	}
	l.signal()
}

// signal wakes the feeds waiting on the log.
func (l *feedLog) signal() {
	if l.wake != nil {
		close(l.wake)
		l.wake = nil
	}
}

// waitChan returns the channel closed at the next change or progress
// request. The caller holds s.mu.
func (l *feedLog) waitChan() <-chan struct{} {
	if l.wake == nil {
		l.wake = make(chan struct{})
	}
	return l.wake
}

// expire drops the log, as an etcd compaction at the current revision does.
func (l *feedLog) expire(revision int64) {
	l.events = nil
	l.start = revision
}

// WatchRows opens a feed of the rows under req.Prefix (authority.RowFeed).
func (s *Store) WatchRows(ctx context.Context, req authority.FeedRequest) (authority.Feed, error) {
	if err := authority.ValidateFeedRequest(req); err != nil {
		return nil, err
	}
	if _, err := s.lock(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	if !s.feed.on {
		s.feed.on = true
		s.feed.start = s.revision
	}
	f := &memoryFeed{s: s, prefix: req.Prefix, pos: req.After, closed: make(chan struct{})}
	switch {
	case req.List:
		f.pos = s.revision
		f.listing = s.listFeedRows(req.Prefix)
		f.listed = true
	case req.After == 0:
		f.pos = s.revision
		f.progress = true // the first batch says where the feed starts
	case req.After > s.revision:
		return nil, authority.Invalid("Feed After is past the store's revision.")
	}
	return f, nil
}

// FeedRevision returns the store's current revision (authority.RowFeed).
func (s *Store) FeedRevision(ctx context.Context) (int64, error) {
	if _, err := s.lock(ctx); err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	return s.revision, nil
}

// listFeedRows returns every row under prefix as created events at the
// current revision. The caller holds s.mu.
func (s *Store) listFeedRows(prefix string) []authority.FeedEvent {
	var out []authority.FeedEvent
	s.index.Ascend(&row{key: authority.Key(prefix)}, func(r *row) bool {
		if !strings.HasPrefix(string(r.key), prefix) {
			return false
		}
		out = append(out, authority.FeedEvent{Kind: authority.FeedCreated, Key: r.key, Snapshot: r.snapshot(s.epoch), Revision: s.revision})
		return true
	})
	return out
}

// memoryFeed is an open feed of a memory store.
type memoryFeed struct {
	s      *Store
	prefix string
	// under s.mu
	pos      int64
	listing  []authority.FeedEvent
	listed   bool // the listing's FeedSynced is still to come
	progress bool // a progress batch is asked for
	done     bool
	// err ends the feed (ErrFeedCompacted)
	err error

	closeOnce sync.Once
	closed    chan struct{}
}

// Next returns the next batch (authority.Feed).
func (f *memoryFeed) Next(ctx context.Context) (authority.FeedBatch, error) {
	s := f.s
	for {
		if err := ctx.Err(); err != nil {
			return authority.FeedBatch{}, err
		}
		s.mu.Lock()
		b, ok, err := f.take()
		if ok || err != nil {
			s.mu.Unlock()
			return b, err
		}
		wake := s.feed.waitChan()
		s.mu.Unlock()
		select {
		case <-wake:
		case <-f.closed:
		case <-ctx.Done():
		}
	}
}

// take returns the next batch when there is one. The caller holds s.mu.
func (f *memoryFeed) take() (authority.FeedBatch, bool, error) {
	s, l := f.s, &f.s.feed
	if f.done {
		return authority.FeedBatch{}, false, authority.ErrClosed
	}
	if f.err != nil {
		return authority.FeedBatch{}, false, f.err
	}
	if f.listed {
		if len(f.listing) > 0 {
			n := min(len(f.listing), feedBatchMax)
			evs := cloneEvents(f.listing[:n], s.clock)
			f.listing = f.listing[n:]
			return authority.FeedBatch{Kind: authority.FeedListed, Events: evs, Revision: f.pos}, true, nil
		}
		f.listed, f.listing = false, nil
		return authority.FeedBatch{Kind: authority.FeedSynced, Revision: f.pos}, true, nil
	}
	if f.pos < l.start {
		f.err = authority.Wrap(authority.ErrFeedCompacted,
			"memory feed: the changes after revision "+itoa(f.pos)+" are no longer kept (FeedRetention)", nil)
		return authority.FeedBatch{}, false, f.err
	}
	i := sort.Search(len(l.events), func(i int) bool { return l.events[i].Revision > f.pos })
	var evs []authority.FeedEvent
	for ; i < len(l.events) && len(evs) < feedBatchMax; i++ {
		if strings.HasPrefix(string(l.events[i].Key), f.prefix) {
			evs = append(evs, l.events[i])
		}
	}
	last := s.revision
	if i < len(l.events) {
		last = l.events[i-1].Revision
	}
	f.pos = last
	if len(evs) > 0 {
		return authority.FeedBatch{Kind: authority.FeedChanged, Events: cloneEvents(evs, s.clock), Revision: last}, true, nil
	}
	if f.progress {
		f.progress = false
		return authority.FeedBatch{Kind: authority.FeedProgress, Revision: last}, true, nil
	}
	return authority.FeedBatch{}, false, nil
}

// cloneEvents returns caller-owned copies of evs, stamped with the clock.
func cloneEvents(evs []authority.FeedEvent, clock authority.Clock) []authority.FeedEvent {
	now := clock.Now()
	out := make([]authority.FeedEvent, len(evs))
	for i, ev := range evs {
		if ev.Snapshot != nil {
			ev.Snapshot = ev.Snapshot.Clone()
			ev.Snapshot.StoreNow = now
		}
		out[i] = ev
	}
	return out
}

// RequestProgress asks for a progress batch (authority.Feed).
func (f *memoryFeed) RequestProgress(ctx context.Context) error {
	if _, err := f.s.lock(ctx); err != nil {
		return err
	}
	defer f.s.mu.Unlock()
	if f.done {
		return authority.ErrClosed
	}
	f.progress = true
	f.s.feed.signal()
	return nil
}

// Close ends the feed (authority.Feed).
func (f *memoryFeed) Close() error {
	f.s.mu.Lock()
	f.done = true
	f.s.mu.Unlock()
	f.closeOnce.Do(func() { close(f.closed) })
	return nil
}

func itoa(n int64) string { return version(n).String() }
