package conformance

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
)

// feedSteps is how many operations a feed workload runs
// (AUTHORITY_FEED_STEPS overrides it for a soak).
func feedSteps() int {
	if n, err := strconv.Atoi(os.Getenv("AUTHORITY_FEED_STEPS")); err == nil && n > 0 {
		return n
	}
	return 120
}

// RunTestFeed checks the row feed (authority.RowFeed): under a random
// workload every change is delivered exactly once and in order, a feed on
// a prefix sees only its rows, a listing start matches ListAuthorities, a
// feed resumes after an interruption, a compacted history gives
// ErrFeedCompacted, progress reaches the store's revision with no write
// under the prefix, and bad requests are ErrInvalidArgument. Providers
// without the capability skip it.
func RunTestFeed(ctx context.Context, t *testing.T, f Factory) {
	runSubtests(ctx, t, f, []subtest{
		{"FeedWorkload", testFeedWorkload},
		{"FeedListing", testFeedListing},
		{"FeedResume", testFeedResume},
		{"FeedCompacted", testFeedCompacted},
		{"FeedProgress", testFeedProgress},
		{"FeedValidation", testFeedValidation},
	})
}

// testFeedWorkload follows every row and the actors alone through a random
// workload, draining the feeds now and then, and checks what they delivered
// against the states read back and, at the end, against a listing.
func testFeedWorkload(t *testing.T, fx *Fixture) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("feed workload seed %d", seed)
	all := openFeed(t, fx, authority.FeedRequest{List: true})
	actors := openFeed(t, fx, authority.FeedRequest{Prefix: authority.KindPrefix(authority.ObjectActor)})
	la, lact := newFeedLog(t), newFeedLog(t)
	w := newFeedWorkload(t, fx, seed)
	steps := feedSteps()
	for i := range steps {
		w.step()
		if i%25 == 24 || i == steps-1 {
			now := feedNow(t, fx)
			la.until(fx.Ctx(), all, now)
			lact.until(fx.Ctx(), actors, now)
		}
	}
	t.Logf("feed workload: %d events in %d batches; operations %v", len(la.events), la.batches, w.ops)
	require.True(t, la.synced)
	w.requireDelivered(la, "")
	w.requireDelivered(lact, authority.KindPrefix(authority.ObjectActor))
	for _, p := range StatePrefixes {
		rows := map[authority.Key]*authority.Snapshot{}
		for k, s := range la.apply() {
			if len(k) >= len(p) && string(k[:len(p)]) == p {
				rows[k] = s
			}
		}
		requireMatchesListing(t, fx, p, rows)
	}
}

// testFeedListing starts a feed with a listing of existing rows: the
// listing is the store's rows under the prefix, and changes follow it.
func testFeedListing(t *testing.T, fx *Fixture) {
	for i := range 25 {
		fx.Active(authority.ObjectUserSpot, fmt.Sprintf("listed-%02d", i), TargetA)
	}
	fx.Active(authority.ObjectActor, "other-kind", TargetA)
	prefix := authority.KindPrefix(authority.ObjectUserSpot)
	feed := openFeed(t, fx, authority.FeedRequest{Prefix: prefix, List: true})
	l := newFeedLog(t)
	l.until(fx.Ctx(), feed, feedNow(t, fx))
	require.True(t, l.synced)
	requireMatchesListing(t, fx, prefix, l.apply())

	key := fx.Key(authority.ObjectUserSpot, "listed-03")
	put := fx.Put(key, fx.MustRow(key).StoreVersion, []byte("after listing"))
	fx.Active(authority.ObjectUserSpot, "after-listing", TargetB)
	l.until(fx.Ctx(), feed, feedNow(t, fx))
	require.Len(t, l.events, 3) // the put, the reserve and the commit
	ev := l.events[0]
	if _, ok := fx.Store().(authority.FeedPositioner); ok {
		// over several shards changes of different shards have no order
		// (docs/deviations.md D5): the put is the event of its key
		for _, e := range l.events {
			if e.Key == key {
				ev = e
			}
		}
	}
	require.Equal(t, key, ev.Key)
	require.Equal(t, authority.FeedUpdated, ev.Kind)
	RequireSameRow(t, put, ev.Snapshot)
	requireMatchesListing(t, fx, prefix, l.apply())
}

// testFeedResume interrupts a feed halfway through a workload and resumes
// it from the last revision it delivered: together the two deliver every
// change once.
func testFeedResume(t *testing.T, fx *Fixture) {
	w := newFeedWorkload(t, fx, uint64(time.Now().UnixNano()))
	feed := openFeed(t, fx, authority.FeedRequest{})
	l := newFeedLog(t)
	for range 30 {
		w.step()
	}
	l.until(fx.Ctx(), feed, feedMark{rev: feedNow(t, fx).rev - 3}) // part of it, maybe all
	require.NoError(t, feed.Close())
	_, err := feed.Next(fx.Ctx())
	require.ErrorIs(t, err, authority.ErrClosed)
	for range 30 {
		w.step()
	}
	resumed := openFeed(t, fx, l.resume())
	l.until(fx.Ctx(), resumed, feedNow(t, fx))
	w.requireDelivered(l, "")
}

// testFeedCompacted resumes a feed from before a compaction (ExpireScans):
// WatchRows or the feed's Next reports ErrFeedCompacted, never a gap; a
// relist then starts over.
func testFeedCompacted(t *testing.T, fx *Fixture) {
	if fx.H.ExpireScans == nil {
		t.Skip("provider cannot compact its history")
	}
	feed := openFeed(t, fx, authority.FeedRequest{})
	l := newFeedLog(t)
	l.until(fx.Ctx(), feed, feedNow(t, fx))
	require.NoError(t, feed.Close())
	for i := range 3 {
		fx.Active(authority.ObjectUserSpot, fmt.Sprintf("gone-%d", i), TargetA)
	}
	fx.H.ExpireScans(t)
	rf := feedOf(t, fx)
	resumed, err := rf.WatchRows(fx.Ctx(), l.resume())
	if err == nil {
		t.Cleanup(func() { _ = resumed.Close() })
		ctx, cancel := context.WithTimeout(fx.Ctx(), time.Minute)
		defer cancel()
		_, err = resumed.Next(ctx)
	}
	require.ErrorIs(t, err, authority.ErrFeedCompacted)
	relist := openFeed(t, fx, authority.FeedRequest{List: true})
	l2 := newFeedLog(t)
	l2.until(fx.Ctx(), relist, feedNow(t, fx))
	requireMatchesListing(t, fx, authority.KindPrefix(authority.ObjectUserSpot), l2.apply())
}

// testFeedProgress moves the store's revision with writes outside the
// feed's prefix: progress (asked for) reaches that revision, with no event.
func testFeedProgress(t *testing.T, fx *Fixture) {
	feed := openFeed(t, fx, authority.FeedRequest{Prefix: authority.KindPrefix(authority.ObjectUserSpot)})
	first, err := feed.Next(fx.Ctx())
	require.NoError(t, err)
	require.Equal(t, authority.FeedProgress, first.Kind, "a feed from now starts with its position")
	fx.Active(authority.ObjectActor, "elsewhere", TargetA)
	now := feedNow(t, fx)
	require.Greater(t, now.rev, first.Revision)
	if err := feed.RequestProgress(fx.Ctx()); errors.Is(err, authority.ErrUnsupportedServer) {
		t.Skip("server's progress notifications are not reliable: " + err.Error())
	} else {
		require.NoError(t, err)
	}
	l := newFeedLog(t)
	l.rev, l.pos = first.Revision, first.Position.Clone()
	l.until(fx.Ctx(), feed, now)
	require.Empty(t, l.events)
	require.GreaterOrEqual(t, l.rev, now.rev)
}

// testFeedValidation checks that bad requests are ErrInvalidArgument.
func testFeedValidation(t *testing.T, fx *Fixture) {
	rf := feedOf(t, fx)
	for _, req := range []authority.FeedRequest{
		{Prefix: "user_spot/\x00"},
		{After: -1},
		{List: true, After: 1},
		{After: 1, AfterPosition: authority.FeedPosition{1}},
		{List: true, AfterPosition: authority.FeedPosition{1}},
		{AfterPosition: authority.FeedPosition{}},
	} {
		_, err := rf.WatchRows(fx.Ctx(), req)
		require.ErrorIs(t, err, authority.ErrInvalidArgument, "%+v", req)
	}
}
