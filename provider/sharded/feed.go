package sharded

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	authority "github.com/zlink-systems/authority"
)

// The row feed across shards (authority.RowFeed, authority.FeedPositioner).
// A feed is one etcd feed per shard, merged: each shard's batches come in
// that shard's commit order, and the merge interleaves the shards as their
// batches arrive (changes of different shards have no order: no Txn spans
// two clusters). The feed's position is one revision per shard
// (FeedBatch.Position); a batch's Revision, and every event's, is the sum of
// the position after it (after the event), which only grows. A feed resumes
// after a Position (FeedRequest.AfterPosition: each shard's feed after its
// revision). A store of one shard also takes FeedRequest.After, its one
// revision.

// FeedPosition returns the store's current position: each shard's revision,
// read linearizably, in parallel.
func (s *Store) FeedPosition(ctx context.Context) (authority.FeedPosition, error) {
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	t := s.topo.Load()
	pos := make(authority.FeedPosition, len(t.shards))
	err := s.eachShard(ctx, t, func(ctx context.Context, i int, sh *shard) (err error) {
		pos[i], err = sh.store.FeedRevision(ctx)
		return err
	})
	if err != nil {
		return nil, err
	}
	return pos, nil
}

// FeedRevision returns the sum of FeedPosition's revisions: it only grows,
// and every change committed before the call is at or before it in its
// shard; a feed whose Revision reached it may still lag in one shard (use
// FeedPosition and FeedPosition.Covers for that).
func (s *Store) FeedRevision(ctx context.Context) (int64, error) {
	pos, err := s.FeedPosition(ctx)
	return pos.Sum(), err
}

// WatchRows opens a feed of the rows under req.Prefix in every shard.
func (s *Store) WatchRows(ctx context.Context, req authority.FeedRequest) (authority.Feed, error) {
	t := s.topo.Load()
	if req.After != 0 && len(t.shards) > 1 {
		return nil, authority.Invalid(fmt.Sprintf(
			"Feed After is one revision; a store of %d shards resumes a feed with AfterPosition (an earlier batch's Position).", len(t.shards)))
	}
	if req.After > 0 && !req.List && req.AfterPosition == nil {
		req.AfterPosition, req.After = authority.FeedPosition{req.After}, 0
	}
	if err := authority.ValidatePositionedFeedRequest(req, len(t.shards)); err != nil {
		return nil, err
	}
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	f := &mergedFeed{s: s, t: t, feeds: make([]authority.Feed, len(t.shards)), pos: make(authority.FeedPosition, len(t.shards)), num: t.num}
	// each shard's feed lives as long as ctx (authority.RowFeed): opened on
	// ctx itself, not on a context that ends when the opening does
	errs := make([]error, len(t.shards))
	var wg sync.WaitGroup
	for i, sh := range t.shards {
		r := req
		r.AfterPosition = nil
		if req.AfterPosition != nil {
			r.After = req.AfterPosition[i]
			f.pos[i] = r.After
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.feeds[i], errs[i] = sh.store.WatchRows(ctx, r)
			errs[i] = inShard(i, errs[i])
		}()
	}
	wg.Wait()
	err := errors.Join(errs...)
	for _, e := range errs {
		if e != nil {
			err = e // the lowest shard's
			break
		}
	}
	if err == nil && req.AfterPosition == nil {
		err = f.start(ctx, req.List)
	}
	if err != nil {
		f.closeFeeds()
		return nil, err
	}
	f.sum = f.pos.Sum()
	f.run(s.life)
	return f, nil
}

// mergedFeed is an open feed over every shard.
type mergedFeed struct {
	s     *Store
	t     *topology        // the map the feed follows
	feeds []authority.Feed // by shard
	num   numbering        // the store's row numbers

	// used by Next only
	pos     authority.FeedPosition
	sum     int64
	pending []authority.FeedBatch
	err     error

	in     chan shardBatch
	life   context.Context
	stop   context.CancelFunc
	pumps  sync.WaitGroup
	once   sync.Once
	closed atomic.Bool
}

// shardBatch is one shard feed's Next.
type shardBatch struct {
	shard int
	b     authority.FeedBatch
	err   error
}

// start reads every shard feed's start: its listing up to FeedSynced (List)
// or its first batch, the revision it starts at. Those are in the shard
// feeds' memory already (an etcd feed lists, or learns its revision, when it
// opens). The listing's batches go to pending, each shard's in turn, with
// the sum of every shard's listing revision, then one FeedSynced (or, without
// List, one FeedProgress) at the position they make.
func (f *mergedFeed) start(ctx context.Context, list bool) error {
	var listed []authority.FeedBatch
	for i, sf := range f.feeds {
		for {
			b, err := sf.Next(ctx)
			if err != nil {
				return inShard(i, err)
			}
			switch {
			case list && b.Kind == authority.FeedListed:
				b = f.own(i, b)
				if err := f.num.events(i, b.Events); err != nil {
					return inShard(i, err)
				}
				listed = append(listed, b)
				continue
			case list && b.Kind == authority.FeedSynced, !list && b.Kind == authority.FeedProgress:
				f.pos[i] = b.Revision
			default:
				return inShard(i, authority.Wrap(authority.ErrUnavailable,
					fmt.Sprintf("The shard's feed started with a %s batch.", b.Kind), nil))
			}
			break
		}
	}
	sum := f.pos.Sum()
	for _, b := range listed {
		b.Revision = sum
		for j := range b.Events {
			b.Events[j].Revision = sum
		}
		f.pending = append(f.pending, b)
	}
	kind := authority.FeedProgress
	if list {
		kind = authority.FeedSynced
	}
	f.pending = append(f.pending, authority.FeedBatch{Kind: kind, Revision: sum, Position: f.pos.Clone()})
	return nil
}

// run starts one goroutine per shard feed, each handing its batches to Next
// in that shard's order until its feed fails, or the merged feed or the
// store (life) closes.
func (f *mergedFeed) run(life context.Context) {
	f.in = make(chan shardBatch)
	f.life, f.stop = context.WithCancel(life)
	for i, sf := range f.feeds {
		f.pumps.Add(1)
		go func() {
			defer f.pumps.Done()
			for {
				b, err := sf.Next(f.life)
				select {
				case f.in <- shardBatch{shard: i, b: b, err: err}:
				case <-f.life.Done():
					return
				}
				if err != nil {
					return
				}
			}
		}()
	}
}

// Next returns the next batch of any shard, as the merged feed's. Once
// the map in force is another epoch than the feed's (a resharding
// switched), the feed ends with ErrFeedCompacted: its position names the
// shards of a map no longer in force, so a consumer lists again.
func (f *mergedFeed) Next(ctx context.Context) (authority.FeedBatch, error) {
	if f.closed.Load() {
		return authority.FeedBatch{}, authority.ErrClosed
	}
	if f.err != nil {
		return authority.FeedBatch{}, f.err
	}
	if len(f.pending) > 0 {
		b := f.pending[0]
		f.pending = f.pending[1:]
		return b, nil
	}
	topo := f.t
	for {
		select {
		case <-ctx.Done():
			return authority.FeedBatch{}, ctx.Err()
		case <-f.life.Done():
			return authority.FeedBatch{}, authority.ErrClosed
		case <-topo.done:
			if topo = f.s.topo.Load(); topo.smap.Epoch != f.t.smap.Epoch {
				f.err = authority.Wrap(authority.ErrFeedCompacted, fmt.Sprintf(
					"The shard map moved from epoch %d to epoch %d (a resharding switched): list again.", f.t.smap.Epoch, topo.smap.Epoch), nil)
				return authority.FeedBatch{}, f.err
			}
		case sb := <-f.in:
			b, err := f.merge(sb)
			if err != nil {
				f.err = err
				if f.closed.Load() {
					return authority.FeedBatch{}, authority.ErrClosed
				}
			}
			return b, err
		}
	}
}

// own returns b without the events of keys that shard i holds but that
// are not its rows under the feed's map (a resharding's copies and the
// keys it moved away, until deleted).
func (f *mergedFeed) own(i int, b authority.FeedBatch) authority.FeedBatch {
	if len(f.t.shards) == 1 && f.t.move == nil {
		return b
	}
	kept := b.Events[:0:0]
	for _, ev := range b.Events {
		if f.t.shardOf(ev.Key) == i {
			kept = append(kept, ev)
		}
	}
	b.Events = kept
	return b
}

// merge turns one shard's batch into the merged feed's: the shard's part of
// the position moves to the batch's revision, each event's revision
// becomes the position's sum after it.
func (f *mergedFeed) merge(sb shardBatch) (authority.FeedBatch, error) {
	i, b := sb.shard, sb.b
	if sb.err != nil {
		return authority.FeedBatch{}, inShard(i, sb.err)
	}
	if b.Kind != authority.FeedChanged && b.Kind != authority.FeedProgress || b.Revision < f.pos[i] {
		return authority.FeedBatch{}, inShard(i, authority.Wrap(authority.ErrUnavailable, fmt.Sprintf(
			"The shard's feed delivered a %s batch at revision %d after revision %d.", b.Kind, b.Revision, f.pos[i]), nil))
	}
	if err := f.num.events(i, b.Events); err != nil {
		return authority.FeedBatch{}, inShard(i, err)
	}
	start, last := f.pos[i], f.pos[i]
	for j := range b.Events {
		ev := &b.Events[j]
		if ev.Revision <= start || ev.Revision < last || ev.Revision > b.Revision {
			return authority.FeedBatch{}, inShard(i, authority.Wrap(authority.ErrUnavailable, fmt.Sprintf(
				"The shard's feed delivered an event at revision %d after revision %d (batch at %d).", ev.Revision, last, b.Revision), nil))
		}
		last = ev.Revision
		f.advance(i, ev.Revision)
		ev.Revision = f.sum
	}
	f.advance(i, b.Revision)
	b.Revision, b.Position = f.sum, f.pos.Clone()
	if kept := f.own(i, b); len(kept.Events) < len(b.Events) {
		b = kept
		if len(b.Events) == 0 {
			b.Kind = authority.FeedProgress
		}
	}
	return b, nil
}

func (f *mergedFeed) advance(i int, rev int64) {
	if rev > f.pos[i] {
		f.sum += rev - f.pos[i]
		f.pos[i] = rev
	}
}

// RequestProgress asks every shard's feed for progress: each delivers a
// batch at least at its shard's revision at the call, so the merged feed
// reaches a Position covering FeedPosition's at the call.
// ErrUnsupportedServer when a shard's server cannot promise it.
func (f *mergedFeed) RequestProgress(ctx context.Context) error {
	if f.closed.Load() {
		return authority.ErrClosed
	}
	errs := make([]error, len(f.feeds))
	var wg sync.WaitGroup
	for i, sf := range f.feeds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = inShard(i, sf.RequestProgress(ctx))
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if errors.Is(err, authority.ErrUnsupportedServer) {
			return err
		}
	}
	return errors.Join(errs...)
}

// Close ends the feed and every shard's feed.
func (f *mergedFeed) Close() error {
	f.once.Do(func() {
		f.closed.Store(true)
		f.stop()
		f.closeFeeds()
		f.pumps.Wait()
	})
	return nil
}

func (f *mergedFeed) closeFeeds() {
	for _, sf := range f.feeds {
		if sf != nil {
			_ = sf.Close()
		}
	}
}
