package conformance

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
)

// feedOf returns the store's row feed capability, or skips t.
func feedOf(t *testing.T, fx *Fixture) authority.RowFeed {
	t.Helper()
	rf, ok := fx.Store().(authority.RowFeed)
	if !ok {
		t.Skip("provider has no row feed")
	}
	return rf
}

// openFeed opens a feed and closes it when t ends.
func openFeed(t *testing.T, fx *Fixture, req authority.FeedRequest) authority.Feed {
	t.Helper()
	feed, err := feedOf(t, fx).WatchRows(fx.Ctx(), req)
	require.NoError(t, err)
	t.Cleanup(func() { _ = feed.Close() })
	return feed
}

// feedLog is what a consumer saw of a feed, checked batch by batch: batch
// revisions never decrease, and every changed event is after the previous
// batch's revision, in revision order, and no later than its own batch's.
type feedLog struct {
	t       testing.TB
	rev     int64
	pos     authority.FeedPosition // a FeedPositioner's feed: the last batch's Position
	listing bool                   // a FeedListed batch came: read on to FeedSynced
	synced  bool
	listed  map[authority.Key]*authority.Snapshot
	events  []authority.FeedEvent
	batches int
}

func newFeedLog(t testing.TB) *feedLog {
	return &feedLog{t: t, listed: map[authority.Key]*authority.Snapshot{}}
}

// add checks b and appends its events.
func (l *feedLog) add(b authority.FeedBatch) {
	t := l.t
	t.Helper()
	l.batches++
	require.GreaterOrEqual(t, b.Revision, l.rev, "batch revision went back")
	l.checkPosition(b)
	switch b.Kind {
	case authority.FeedListed:
		require.False(t, l.synced, "listed batch after synced")
		l.listing = true
		for _, ev := range b.Events {
			require.Equal(t, authority.FeedCreated, ev.Kind)
			require.Equal(t, b.Revision, ev.Revision)
			require.NotNil(t, ev.Snapshot)
			require.NotContains(t, l.listed, ev.Key, "row listed twice")
			l.listed[ev.Key] = ev.Snapshot
		}
	case authority.FeedSynced:
		require.Empty(t, b.Events)
		l.synced = true
	case authority.FeedProgress:
		require.Empty(t, b.Events)
	case authority.FeedChanged:
		require.NotEmpty(t, b.Events)
		prev := l.rev
		for _, ev := range b.Events {
			require.Greater(t, ev.Revision, l.rev, "event at or before the previous batch")
			require.GreaterOrEqual(t, ev.Revision, prev, "events out of order")
			require.LessOrEqual(t, ev.Revision, b.Revision)
			require.Equal(t, ev.Kind == authority.FeedRemoved, ev.Snapshot == nil, "event %+v", ev)
			prev = ev.Revision
		}
		l.events = append(l.events, b.Events...)
	default:
		t.Fatalf("unknown batch kind %q", b.Kind)
	}
	l.rev = b.Revision
}

// checkPosition checks a FeedPositioner's batch position: set on every
// batch but a listed one, of one length, never going back in any sequence,
// its sum the batch's Revision.
func (l *feedLog) checkPosition(b authority.FeedBatch) {
	t := l.t
	t.Helper()
	if b.Position == nil {
		require.True(t, b.Kind == authority.FeedListed || l.pos == nil, "a %s batch without a position after batches with one", b.Kind)
		return
	}
	require.Equal(t, b.Position.Sum(), b.Revision, "a batch's revision is its position's sum")
	if l.pos != nil {
		require.Len(t, b.Position, len(l.pos))
		require.True(t, b.Position.Covers(l.pos), "batch position %v went back from %v", b.Position, l.pos)
	}
	l.pos = b.Position.Clone()
}

// feedMark is how far a feed must come: the store's revision and, on a
// FeedPositioner, its position (both read by feedNow).
type feedMark struct {
	rev int64
	pos authority.FeedPosition
}

// reached reports whether l has come to m: its revision and, when m has
// one, its position.
func (l *feedLog) reached(m feedMark) bool {
	return l.rev >= m.rev && (m.pos == nil || l.pos.Covers(m.pos))
}

// resume returns the request that resumes a feed after what l saw.
func (l *feedLog) resume() authority.FeedRequest {
	if l.pos != nil {
		return authority.FeedRequest{AfterPosition: l.pos.Clone()}
	}
	return authority.FeedRequest{After: l.rev}
}

// until reads feed into l until it reaches m, asking for progress now and
// then (a feed reaches m by events or by progress). On a store without
// progress promises (ErrUnsupportedServer) nothing but a row change moves
// the feed, so it stops once the feed was quiet for a second.
func (l *feedLog) until(ctx context.Context, feed authority.Feed, m feedMark) {
	t := l.t
	t.Helper()
	quiet := 0
	for !l.reached(m) || l.listing && !l.synced {
		nctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		b, err := feed.Next(nctx)
		cancel()
		if err != nil && ctx.Err() == nil && nctx.Err() != nil {
			if perr := feed.RequestProgress(ctx); perr != nil {
				require.ErrorIs(t, perr, authority.ErrUnsupportedServer)
				// quiet for a second and not inside a listing (a feed
				// over an empty prefix lists nothing: synced without a
				// listed batch)
				if quiet++; quiet >= 5 && (l.synced || !l.listing) {
					return
				}
			}
			continue
		}
		quiet = 0
		require.NoError(t, err)
		l.add(b)
	}
}

// perKey returns, per key, the sequence of states the events moved the row
// through: its StoreVersion, "" for removed.
func (l *feedLog) perKey() map[authority.Key][]authority.StoreVersion {
	out := map[authority.Key][]authority.StoreVersion{}
	for _, ev := range l.events {
		v := authority.StoreVersion("")
		if ev.Snapshot != nil {
			v = ev.Snapshot.StoreVersion
		}
		out[ev.Key] = append(out[ev.Key], v)
	}
	return out
}

// apply replays the listing and the events onto a map of rows, checking
// that each event's kind fits the row before it.
func (l *feedLog) apply() map[authority.Key]*authority.Snapshot {
	t := l.t
	t.Helper()
	rows := map[authority.Key]*authority.Snapshot{}
	for k, s := range l.listed {
		rows[k] = s
	}
	for _, ev := range l.events {
		_, had := rows[ev.Key]
		switch ev.Kind {
		case authority.FeedCreated:
			require.False(t, had, "created %s, which exists", ev.Key)
			rows[ev.Key] = ev.Snapshot
		case authority.FeedUpdated:
			require.True(t, had, "updated %s, which does not exist", ev.Key)
			require.NotEqual(t, rows[ev.Key].StoreVersion, ev.Snapshot.StoreVersion, "update of %s repeats its version", ev.Key)
			rows[ev.Key] = ev.Snapshot
		case authority.FeedRemoved:
			require.True(t, had, "removed %s, which does not exist", ev.Key)
			delete(rows, ev.Key)
		}
	}
	return rows
}

// requireMatchesListing requires rows to be the store's rows under prefix,
// as ListAuthorities returns them.
func requireMatchesListing(t testing.TB, fx *Fixture, prefix string, rows map[authority.Key]*authority.Snapshot) {
	t.Helper()
	items := fx.ListAll(prefix, authority.MaxScanLimit)
	require.Len(t, rows, len(items), "rows from the feed vs the listing")
	for _, it := range items {
		got, ok := rows[it.Key]
		require.True(t, ok, "listed row %s missing from the feed", it.Key)
		RequireSameRow(t, it.Snapshot, got)
	}
}

// feedNow returns the store's current revision and, on a FeedPositioner,
// its position.
func feedNow(t testing.TB, fx *Fixture) feedMark {
	t.Helper()
	if fp, ok := fx.Store().(authority.FeedPositioner); ok {
		pos, err := fp.FeedPosition(fx.Ctx())
		require.NoError(t, err)
		return feedMark{rev: pos.Sum(), pos: pos}
	}
	rev, err := fx.Store().(authority.RowFeed).FeedRevision(fx.Ctx())
	require.NoError(t, err)
	return feedMark{rev: rev}
}
