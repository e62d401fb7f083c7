package etcd

import (
	"context"
	"errors"

	authority "github.com/zlink-systems/authority"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Next returns the next batch (authority.Feed): the listing's batches, then
// one batch per watch response that carries changes or progress.
func (f *etcdFeed) Next(ctx context.Context) (authority.FeedBatch, error) {
	if f.isClosed() {
		return authority.FeedBatch{}, authority.ErrClosed
	}
	if f.err != nil {
		return authority.FeedBatch{}, f.err
	}
	if len(f.pending) > 0 {
		b := f.pending[0]
		f.pending[0] = authority.FeedBatch{} // the listing's events are not kept twice
		f.pending = f.pending[1:]
		return b, nil
	}
	for {
		select {
		case <-ctx.Done():
			return authority.FeedBatch{}, ctx.Err()
		case wr, ok := <-f.wch:
			if !ok {
				f.err = f.ended(nil)
				return authority.FeedBatch{}, f.err
			}
			b, ok, err := f.batch(wr)
			if err != nil {
				f.err = err
				return authority.FeedBatch{}, err
			}
			if ok {
				f.pos = b.Revision
				return b, nil
			}
		}
	}
}

// batch turns a watch response into a batch; ok is false when it carries
// nothing for the consumer (the watch's creation).
func (f *etcdFeed) batch(wr clientv3.WatchResponse) (b authority.FeedBatch, ok bool, err error) {
	switch {
	case wr.CompactRevision != 0:
		return b, false, authority.Wrap(authority.ErrFeedCompacted,
			"etcd compacted revision "+itoa(wr.CompactRevision)+", past the feed's position "+itoa(f.pos),
			compactedAt(wr.CompactRevision))
	case wr.Err() != nil:
		return b, false, f.ended(wr.Err())
	case wr.IsProgressNotify():
		return authority.FeedBatch{Kind: authority.FeedProgress, Revision: max(f.pos, wr.Header.Revision)}, true, nil
	case len(wr.Events) == 0:
		return b, false, nil
	}
	now := f.s.clock.Now()
	b = authority.FeedBatch{Kind: authority.FeedChanged, Events: make([]authority.FeedEvent, 0, len(wr.Events))}
	last := f.pos
	for _, e := range wr.Events {
		rev := e.Kv.ModRevision
		if rev < last || rev == f.pos {
			return b, false, authority.Wrap(authority.ErrUnavailable,
				"etcd watch delivered revision "+itoa(rev)+" after "+itoa(last)+"; resume the feed", nil)
		}
		ev, err := f.decode(e.Kv, e.Type == mvccpb.DELETE, now)
		if err != nil {
			return b, false, err
		}
		b.Events = append(b.Events, ev)
		last = rev
	}
	b.Revision = last
	return b, true, nil
}

// ended names why the watch ended: the feed or the store closed, the
// feed's context ended, or etcd failed it (ErrUnavailable, resumable).
func (f *etcdFeed) ended(err error) error {
	switch {
	case f.isClosed(), f.s.closed.Load():
		return authority.ErrClosed
	case f.wctx.Err() != nil:
		return f.wctx.Err()
	case err == nil:
		return authority.Wrap(authority.ErrUnavailable, "etcd watch ended", nil)
	}
	if errors.Is(mapError(err, false), authority.ErrUnavailable) {
		return mapError(err, false)
	}
	return authority.Wrap(authority.ErrUnavailable, "etcd watch failed", err)
}

// RequestProgress asks etcd for a progress notification on the feed's watch
// stream (authority.Feed).
func (f *etcdFeed) RequestProgress(ctx context.Context) error {
	if f.isClosed() {
		return authority.ErrClosed
	}
	if !f.reliable {
		return authority.Wrap(authority.ErrUnsupportedServer,
			"etcd before 3.4.31 / 3.5.13 may send a progress notification ahead of undelivered events (etcd-io/etcd#15220)", nil)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := f.watcher.RequestProgress(f.wctx); err != nil {
		return f.ended(err)
	}
	return nil
}

// Close ends the feed (authority.Feed) and waits until its watcher released
// its gRPC streams.
func (f *etcdFeed) Close() error {
	f.closeOnce.Do(func() {
		f.mu.Lock()
		f.closed = true
		f.mu.Unlock()
		f.stopLife()
		f.release()
	})
	return nil
}

// release ends the feed's watch and closes its watcher (on Close, or when
// the store closes).
func (f *etcdFeed) release() {
	f.cancel()
	_ = f.watcher.Close()
}

func (f *etcdFeed) isClosed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.closed
}

// compactedAt is the cause of a feed's ErrFeedCompacted: the revision etcd
// compacted, the oldest it still holds.
type compactedAt int64

func (c compactedAt) Error() string { return "etcd compacted revision " + itoa(int64(c)) }

// FeedCompactRevision returns the oldest revision etcd still held when a
// feed ended with authority.ErrFeedCompacted (a feed resumed after it minus
// one misses nothing more); ok is false for any other error.
func FeedCompactRevision(err error) (rev int64, ok bool) {
	var c compactedAt
	if errors.As(err, &c) {
		return int64(c), true
	}
	return 0, false
}
