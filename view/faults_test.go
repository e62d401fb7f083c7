package view_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	"github.com/zlink-systems/authority/provider/memory"
	"github.com/zlink-systems/authority/view"
)

// faults says what a faultFeed does besides passing its inner feed on.
// Steps count the feed's Next calls from 0; -1 is never.
type faults struct {
	failAt  int   // Next fails with err at this step (and after)
	err     error // the failure (ErrUnavailable when nil)
	stallAt int   // Next waits at this step until its context ends
	// split delivers the listing one row a batch, in random order, and
	// repeat follows every batch after the listing with a progress batch at
	// the same revision: orders the contract allows.
	split, repeat bool
	// deaf makes RequestProgress accept and deliver nothing.
	deaf bool
}

// none is the faults of a feed that only passes its inner feed on.
var none = faults{failAt: -1, stallAt: -1}

// faultStore is a view.Store whose feeds misbehave as plan says for the
// n-th feed opened (from 0); its FeedRevision waits for its context's end
// while stallRevision is set.
type faultStore struct {
	view.Store
	plan          func(n int) faults
	opened        atomic.Int64
	stallRevision atomic.Bool
	// waiting counts the FeedRevision calls stalled now.
	waiting atomic.Int64
	// onOpen, when set, is called after the n-th feed opened.
	onOpen func(n int)
}

func (s *faultStore) WatchRows(ctx context.Context, req authority.FeedRequest) (authority.Feed, error) {
	n := int(s.opened.Add(1) - 1)
	fs := s.plan(n)
	inner, err := s.Store.WatchRows(ctx, req)
	if err != nil {
		return nil, err
	}
	if s.onOpen != nil {
		s.onOpen(n)
	}
	return &faultFeed{inner: inner, f: fs}, nil
}

func (s *faultStore) FeedRevision(ctx context.Context) (int64, error) {
	if s.stallRevision.Load() {
		s.waiting.Add(1)
		<-ctx.Done()
		s.waiting.Add(-1)
		return s.Store.FeedRevision(ctx) // the provider's own answer to an ended context
	}
	return s.Store.FeedRevision(ctx)
}

// faultFeed is a feed that misbehaves as f says.
type faultFeed struct {
	inner   authority.Feed
	f       faults
	step    int
	pending []authority.FeedBatch
}

func (ff *faultFeed) Next(ctx context.Context) (authority.FeedBatch, error) {
	step := ff.step
	ff.step++
	switch {
	case ff.f.failAt >= 0 && step >= ff.f.failAt:
		if ff.f.err != nil {
			return authority.FeedBatch{}, ff.f.err
		}
		return authority.FeedBatch{}, authority.Wrap(authority.ErrUnavailable, "fault: feed failed at step "+fmt.Sprint(step), nil)
	case step == ff.f.stallAt:
		<-ctx.Done()
		return authority.FeedBatch{}, ctx.Err()
	}
	if len(ff.pending) > 0 {
		b := ff.pending[0]
		ff.pending = ff.pending[1:]
		return b, nil
	}
	b, err := ff.inner.Next(ctx)
	if err != nil {
		return b, err
	}
	switch {
	case b.Kind == authority.FeedListed && ff.f.split:
		events := b.Events
		for b.Kind == authority.FeedListed { // the whole listing, then its end
			if b, err = ff.inner.Next(ctx); err != nil {
				return b, err
			}
			events = append(events, b.Events...)
		}
		rand.Shuffle(len(events), func(i, j int) { events[i], events[j] = events[j], events[i] })
		for _, ev := range events {
			ff.pending = append(ff.pending, authority.FeedBatch{Kind: authority.FeedListed, Revision: b.Revision, Events: []authority.FeedEvent{ev}})
		}
		b, ff.pending = ff.pending[0], append(ff.pending[1:], b)
	case b.Kind != authority.FeedListed && ff.f.repeat:
		ff.pending = append(ff.pending, authority.FeedBatch{Kind: authority.FeedProgress, Revision: b.Revision})
	}
	return b, nil
}

func (ff *faultFeed) RequestProgress(ctx context.Context) error {
	if ff.f.deaf {
		return nil
	}
	return ff.inner.RequestProgress(ctx)
}

func (ff *faultFeed) Close() error { return ff.inner.Close() }

// requireSameAsStore requires the view's consistent reads of keys, and its
// listing of every row, to be the store's.
func requireSameAsStore(t *testing.T, fx *conformance.Fixture, v *view.View, keys []authority.Key) {
	t.Helper()
	for _, key := range keys {
		want := fx.Read(key)
		got, err := v.Read(fx.Ctx(), key, view.Freshness{})
		require.NoError(t, err)
		require.Equal(t, want.Kind, got.Kind, "row %s", key)
		if want.Kind == authority.KindSnapshot {
			conformance.RequireSameRow(t, want.Snapshot, got.Snapshot)
		}
	}
	requireListing(t, fx, v, "", 2)
}

// TestViewFeedFaults runs a view on feeds that fail, stall or reorder at
// each step the RowFeed contract allows, the first feed and later ones:
// whatever the feed does, the view ends up answering as the store does (a
// first feed that fails before its listing ends is listed again, never
// resumed "from now").
func TestViewFeedFaults(t *testing.T) {
	const rows = 5 // split: steps 0-4 listed, 5 synced, 6 and on changes
	type tc struct {
		name string
		plan func(n int) faults
	}
	var cases []tc
	for _, step := range []int{0, 1, 3, 5, 6, 7} {
		for _, ferr := range []error{nil, authority.ErrFeedCompacted, authority.ErrCorrupt} {
			name := fmt.Sprintf("first-fails-at-%d/%v", step, ferr)
			cases = append(cases, tc{name, func(n int) faults {
				if n > 0 {
					return none
				}
				return faults{failAt: step, err: ferr, stallAt: -1, split: true, repeat: true}
			}})
		}
		cases = append(cases, tc{fmt.Sprintf("every-feed-fails-at-%d-thrice", step), func(n int) faults {
			if n > 2 {
				return faults{failAt: -1, stallAt: -1, split: true, repeat: true}
			}
			return faults{failAt: step, stallAt: -1, split: true}
		}})
	}
	cases = append(cases,
		tc{"reordered-listing-and-repeated-revisions", func(int) faults {
			return faults{failAt: -1, stallAt: -1, split: true, repeat: true}
		}},
		tc{"resumed-feed-compacted-at-once", func(n int) faults {
			switch n {
			case 0:
				return faults{failAt: 7, stallAt: -1}
			case 1:
				return faults{failAt: 0, err: authority.ErrFeedCompacted, stallAt: -1}
			}
			return none
		}},
	)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			mem, h := memoryHarness(t, memory.Config{})
			fx := conformance.NewFixture(t, h)
			var keys []authority.Key
			for i := range rows {
				fx.Active(authority.ObjectUserSpot, fmt.Sprintf("r-%d", i), conformance.TargetA)
				keys = append(keys, fx.Key(authority.ObjectUserSpot, fmt.Sprintf("r-%d", i)))
			}
			fs := &faultStore{Store: mem, plan: c.plan}
			v, err := view.New(fx.Ctx(), fs, view.Config{})
			require.NoError(t, err)
			t.Cleanup(func() { _ = v.Close() })
			requireSameAsStore(t, fx, v, keys)
			// changes after the faults: a put, a delete, a new row
			snap := fx.Read(keys[0]).Snapshot
			fx.Put(keys[0], snap.StoreVersion, []byte("after"))
			fx.Delete(keys[1], fx.Read(keys[1]).Snapshot.StoreVersion)
			fx.Active(authority.ObjectUserSpot, "new", conformance.TargetB)
			keys = append(keys, fx.Key(authority.ObjectUserSpot, "new"))
			requireSameAsStore(t, fx, v, keys)
			t.Logf("feeds opened %d, stats %+v", fs.opened.Load(), v.Stats())
		})
	}
}

// TestViewFeedStalls: a first feed that stalls before its listing ends
// holds New until its context ends (then New fails and leaves nothing
// running); a feed that stalls after it, or never answers a progress
// request, sends consistent reads to the store after MaxWait.
func TestViewFeedStalls(t *testing.T) {
	mem, h := memoryHarness(t, memory.Config{})
	fx := conformance.NewFixture(t, h)
	fx.Active(authority.ObjectUserSpot, "s", conformance.TargetA)
	key := fx.Key(authority.ObjectUserSpot, "s")
	baseline := goleak.IgnoreCurrent()
	for _, step := range []int{0, 1} {
		fs := &faultStore{Store: mem, plan: func(int) faults { return faults{failAt: -1, stallAt: step, split: true} }}
		ctx, cancel := context.WithTimeout(fx.Ctx(), 50*time.Millisecond)
		_, err := view.New(ctx, fs, view.Config{})
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded, "stall at step %d", step)
	}
	requireNoGoroutines(t, baseline)
	for _, f := range []faults{{failAt: -1, stallAt: 2, split: true}, {failAt: -1, stallAt: -1, deaf: true}} {
		fs := &faultStore{Store: mem, plan: func(int) faults { return f }}
		v, err := view.New(fx.Ctx(), fs, view.Config{MaxWait: 20 * time.Millisecond, Prefix: authority.KindPrefix(authority.ObjectUserSpot)})
		require.NoError(t, err)
		before := v.Revision()
		fx.Put(key, fx.Read(key).Snapshot.StoreVersion, []byte(fmt.Sprintf("%+v", f)))
		for bound := time.Now().Add(time.Minute); f.deaf && v.Revision() == before; {
			require.True(t, time.Now().Before(bound), "the view never applied the put")
			time.Sleep(time.Millisecond)
		}
		// the last write is outside the view's prefix: only progress says
		// the view caught up
		fx.Active(authority.ObjectActor, fmt.Sprintf("outside-%+v", f), conformance.TargetA)
		got, err := v.Read(fx.Ctx(), key, view.Freshness{})
		require.NoError(t, err)
		require.True(t, got.FromStore, "%+v", f)
		conformance.RequireSameRow(t, fx.Read(key).Snapshot, got.Snapshot)
		require.NoError(t, v.Close())
	}
}

// requireNoGoroutines waits (a bounded time) until the goroutines started
// since baseline ended.
func requireNoGoroutines(t *testing.T, baseline goleak.Option) {
	t.Helper()
	bound := time.Now().Add(time.Minute)
	for {
		err := goleak.Find(baseline)
		if err == nil {
			return
		}
		if time.Now().After(bound) {
			t.Fatalf("goroutines left: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestViewCloseFailsWaitingReadsMemory(t *testing.T) {
	mem, h := memoryHarness(t, memory.Config{})
	testViewCloseFailsWaitingReads(t, mem, h)
}

func TestViewCloseFailsWaitingReadsEtcd(t *testing.T) {
	s, h, _ := etcdHarness(t, false)
	testViewCloseFailsWaitingReads(t, s, h)
}

// testViewCloseFailsWaitingReads closes a view while consistent reads wait
// in it, on their revision request (stalled) or for the view to catch up
// (a feed that never answers a progress request): each reports ErrClosed,
// although its own context is live, and so does every read after Close.
func testViewCloseFailsWaitingReads(t *testing.T, store view.Store, h *conformance.Harness) {
	fx := conformance.NewFixture(t, h)
	fx.Active(authority.ObjectUserSpot, "c", conformance.TargetA)
	key := fx.Key(authority.ObjectUserSpot, "c")
	for _, waitOn := range []string{"revision", "catch-up"} {
		t.Run(waitOn, func(t *testing.T) {
			fs := &faultStore{Store: store, plan: func(int) faults { return faults{failAt: -1, stallAt: -1, deaf: true} }}
			v, err := view.New(fx.Ctx(), fs, view.Config{MaxWait: time.Hour, Prefix: authority.KindPrefix(authority.ObjectUserSpot)})
			require.NoError(t, err)
			if waitOn == "revision" {
				fs.stallRevision.Store(true)
			} else {
				// a write outside the view's prefix: the view learns it
				// caught up with it only by progress, which never comes
				fx.Active(authority.ObjectActor, waitOn+"-"+fmt.Sprint(time.Now().UnixNano()), conformance.TargetA)
			}
			const readers = 8
			errs := make(chan error, readers)
			var started sync.WaitGroup
			for range readers {
				started.Add(1)
				go func() {
					started.Done()
					_, err := v.Read(fx.Ctx(), key, view.Freshness{})
					errs <- err
				}()
			}
			started.Wait()
			bound := time.Now().Add(time.Minute)
			for waitOn == "revision" && fs.waiting.Load() == 0 {
				require.True(t, time.Now().Before(bound), "no read reached the revision request")
				time.Sleep(time.Millisecond)
			}
			time.Sleep(20 * time.Millisecond) // the readers are waiting
			require.NoError(t, v.Close())
			for range readers {
				require.ErrorIs(t, <-errs, authority.ErrClosed)
			}
			_, err = v.Read(fx.Ctx(), key, view.Freshness{})
			require.ErrorIs(t, err, authority.ErrClosed)
		})
	}
}

func TestViewNewShortDeadlinesMemory(t *testing.T) {
	_, h := memoryHarness(t, memory.Config{})
	testViewNewShortDeadlines(t, h)
}

func TestViewNewShortDeadlinesEtcd(t *testing.T) {
	_, h, _ := etcdHarness(t, false)
	testViewNewShortDeadlines(t, h)
}

// testViewNewShortDeadlines starts views with deadlines of 0–5 ms, many
// ending while the view opens its feed or lists, and closes those that
// started: every goroutine and gRPC watch stream (counted at an embedded
// server) they opened is released.
func testViewNewShortDeadlines(t *testing.T, h *conformance.Harness) {
	fx := conformance.NewFixture(t, h)
	for i := range 20 {
		fx.Active(authority.ObjectUserSpot, fmt.Sprintf("d-%d", i), conformance.TargetA)
	}
	warm := newView(t, h, view.Config{})
	require.NoError(t, warm.Close())
	failed, started := etcdtest.ShortDeadlines(t, func(ctx context.Context, _ int) error {
		v, err := view.New(ctx, h.Store.(view.Store), view.Config{})
		if err != nil {
			return err
		}
		require.NoError(t, v.Close())
		return nil
	})
	t.Logf("%d starts ended by their deadline, %d started", failed, started)
}

// TestViewNewOnClosingStore: a store that closes while New waits for the
// listing (its first feed failed) ends New with ErrClosed at once, not when
// New's context ends.
func TestViewNewOnClosingStore(t *testing.T) {
	s, _, _ := etcdHarness(t, false)
	fs := &faultStore{Store: s, plan: func(int) faults { return faults{failAt: 0, stallAt: -1} }}
	fs.onOpen = func(n int) {
		if n == 0 {
			require.NoError(t, s.Close())
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := view.New(ctx, fs, view.Config{})
	require.ErrorIs(t, err, authority.ErrClosed)
	require.NoError(t, ctx.Err())
}
