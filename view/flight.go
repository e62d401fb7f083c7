package view

import (
	"context"
	"sync"
	"time"

	authority "github.com/zlink-systems/authority"
)

// flights learns the store's current revision for many waiting reads with
// one request at a time. A read cannot join a request already sent (the
// store may have answered it before the read began, and the revision would
// then miss writes that completed before the read): it joins the next
// request, which starts when the one in flight ends, and every read that
// arrives meanwhile shares it.
type flights struct {
	v       *View
	mu      sync.Mutex
	next    *flight
	running bool
	closed  bool // set by View.Close: no request starts after it
}

// flight is one revision request and its waiters.
type flight struct {
	done  chan struct{}
	start time.Time
	rev   int64
	pos   authority.FeedPosition // on a FeedPositioner
	err   error
}

// revision returns a revision at least the store's revision when the call
// began (on a FeedPositioner, also such a position, whose sum the revision
// is), and when the request that learned it started.
func (fs *flights) revision(ctx context.Context) (int64, authority.FeedPosition, time.Time, error) {
	fs.mu.Lock()
	if fs.closed {
		fs.mu.Unlock()
		return 0, nil, time.Time{}, authority.ErrClosed
	}
	if fs.next == nil {
		fs.next = &flight{done: make(chan struct{})}
	}
	f := fs.next
	if !fs.running {
		fs.running = true
		fs.next = nil
		fs.v.wg.Add(1)
		go fs.fly(f)
	}
	fs.mu.Unlock()
	select {
	case <-f.done:
		return f.rev, f.pos, f.start, f.err
	case <-ctx.Done():
		return 0, nil, time.Time{}, ctx.Err()
	}
}

// fly sends f's request, then the next flight's while reads joined one.
func (fs *flights) fly(f *flight) {
	defer fs.v.wg.Done()
	for f != nil {
		f.start = time.Now()
		if p := fs.v.positioner; p != nil {
			f.pos, f.err = p.FeedPosition(fs.v.life)
			f.rev = f.pos.Sum()
		} else {
			f.rev, f.err = fs.v.store.FeedRevision(fs.v.life)
		}
		if f.err != nil && fs.v.life.Err() != nil {
			f.err = authority.ErrClosed // cut short by Close
		}
		close(f.done)
		fs.mu.Lock()
		f, fs.next = fs.next, nil
		if f == nil {
			fs.running = false
		}
		fs.mu.Unlock()
	}
}
