package etcd_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	authority "github.com/zlink-systems/authority"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
)

// TestFeedProgressNotifyReliable checks the server versions whose progress
// notifications a view may trust: the fixes of etcd-io/etcd#15220 and
// #17557 landed in 3.4.31 and 3.5.13, and 3.6 has them.
func TestFeedProgressNotifyReliable(t *testing.T) {
	for v, want := range map[string]bool{
		"3.4.23": false, "3.4.30": false, "3.4.31": true, "v3.4.37": true,
		"3.5.0": false, "3.5.12": false, "3.5.13": true, "3.5.21": true,
		"3.6.0": true, "3.7.3": true, "3.3.27": false, "": false, "garbage": false,
	} {
		require.Equal(t, want, etcdstore.ProgressNotifyReliable(v), v)
	}
}

// TestFeedKeepUndecodable: a row the store cannot decode ends a feed with
// ErrCorrupt, or, with KeepUndecodable, comes as an event naming it, in
// order, and the feed goes on.
func TestFeedKeepUndecodable(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, nil, etcdstore.Config{})
	rows := s.Namespace() + "rows/"
	open := func(keep bool) authority.Feed {
		f, err := s.WatchRows(ctx, authority.FeedRequest{Prefix: "actor/", KeepUndecodable: keep})
		require.NoError(t, err)
		t.Cleanup(func() { _ = f.Close() })
		return f
	}
	strict, keeping := open(false), open(true)
	bad, err := shared.Put(ctx, rows+"actor/bad", "not a row")
	require.NoError(t, err)
	gone, err := shared.Delete(ctx, rows+"actor/bad")
	require.NoError(t, err)
	var got []authority.FeedEvent
	for len(got) < 2 {
		b, err := keeping.Next(ctx)
		require.NoError(t, err)
		got = append(got, b.Events...)
	}
	require.Equal(t, authority.FeedCreated, got[0].Kind)
	require.Equal(t, bad.Header.Revision, got[0].Revision)
	require.Nil(t, got[0].Snapshot)
	require.ErrorIs(t, got[0].Undecodable, authority.ErrCorrupt)
	require.Equal(t, authority.FeedRemoved, got[1].Kind)
	require.Equal(t, gone.Header.Revision, got[1].Revision)
	for {
		b, err := strict.Next(ctx)
		if err != nil {
			require.ErrorIs(t, err, authority.ErrCorrupt)
			break
		}
		require.Empty(t, b.Events, "a strict feed delivered %+v", b.Events)
	}
}

// TestFeedCompactRevision: a feed resumed after a compacted revision ends
// with ErrFeedCompacted naming the oldest revision etcd holds.
func TestFeedCompactRevision(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, nil, etcdstore.Config{})
	put, err := shared.Put(ctx, s.Namespace()+"rows/actor/gone", "x")
	require.NoError(t, err)
	compactNow(t)
	behind, err := s.WatchRows(ctx, authority.FeedRequest{Prefix: "actor/", After: put.Header.Revision - 1})
	if err == nil {
		defer behind.Close()
		_, err = behind.Next(ctx)
	}
	require.ErrorIs(t, err, authority.ErrFeedCompacted)
	oldest, ok := etcdstore.FeedCompactRevision(err)
	require.True(t, ok)
	require.Greater(t, oldest, put.Header.Revision)
	_, ok = etcdstore.FeedCompactRevision(authority.ErrCorrupt)
	require.False(t, ok)
}

// TestFeedShortDeadlinesReleaseStreams opens feeds with deadlines of 0–5 ms,
// so that many end while WatchRows opens the watch, and closes each: every
// gRPC watch stream (counted at the embedded server) and every goroutine
// they started is released, while the client stays open.
func TestFeedShortDeadlinesReleaseStreams(t *testing.T) {
	s := newStore(t, nil, etcdstore.Config{})
	// the store's own watches are open (at the server too) once a feed was
	warm, err := s.WatchRows(context.Background(), authority.FeedRequest{})
	require.NoError(t, err)
	require.NoError(t, warm.Close())
	ended, opened := etcdtest.ShortDeadlines(t, func(ctx context.Context, i int) error {
		f, err := s.WatchRows(ctx, authority.FeedRequest{Prefix: "actor/", List: i%2 == 0})
		if err == nil {
			_, err = f.Next(ctx)
			// a progress request after the watch ended opens a stream again
			_ = f.RequestProgress(context.Background())
			require.NoError(t, f.Close())
		}
		if err != nil {
			// gRPC, or the server (etcd 3.4 answers code Unknown with the
			// context's text), may time the request out a moment before
			// ctx's timer fires: typed ErrUnavailable, "did not complete"
			require.True(t, ctx.Err() != nil || status.Code(errors.Unwrap(err)) == codes.DeadlineExceeded ||
				strings.Contains(err.Error(), "DeadlineExceeded") ||
				(errors.Is(err, authority.ErrUnavailable) && strings.Contains(err.Error(), "did not complete")),
				"a feed failed, not by its deadline: %v", err)
		}
		return err
	})
	t.Logf("%d opens ended by their deadline, %d opened", ended, opened)
}
