package etcd_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	authority "github.com/zlink-systems/authority"
	"go.uber.org/goleak"
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
	streams, counted := etcdtest.WatchStreams()
	baseline := goleak.IgnoreCurrent()
	ended, opened := 0, 0
	bound := time.Now().Add(2 * time.Minute)
	for i := 0; i < 200 || ended < 50 || opened < 20; i++ {
		require.True(t, time.Now().Before(bound), "after %d opens: %d ended by their deadline, %d opened", i, ended, opened)
		// every seventh open has time to finish (an external server, or a
		// loaded machine, may take longer than 5 ms for every open)
		wait := time.Duration(i%6) * time.Millisecond
		if i%7 == 6 {
			wait = 10 * time.Second
		}
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		req := authority.FeedRequest{Prefix: "actor/", List: i%2 == 0}
		f, err := s.WatchRows(ctx, req)
		if err == nil {
			opened++
			_, err = f.Next(ctx)
			// a progress request after the watch ended opens a stream again
			_ = f.RequestProgress(context.Background())
			require.NoError(t, f.Close())
		}
		if err != nil {
			// gRPC may time the request out a moment before ctx's timer fires
			require.True(t, ctx.Err() != nil || status.Code(errors.Unwrap(err)) == codes.DeadlineExceeded ||
				strings.Contains(err.Error(), "DeadlineExceeded"), "a feed failed, not by its deadline: %v", err)
			ended++
		}
		cancel()
	}
	t.Logf("%d opens ended by their deadline, %d opened", ended, opened)
	requireSettled(t, baseline, streams, counted)
}

// requireSettled waits (a bounded time) until the goroutines started since
// baseline ended and the embedded servers serve at most streams watch
// streams (when counted).
func requireSettled(t *testing.T, baseline goleak.Option, streams int, counted bool) {
	t.Helper()
	bound := time.Now().Add(time.Minute)
	for {
		now, _ := etcdtest.WatchStreams()
		err := goleak.Find(baseline)
		if err == nil && (!counted || now <= streams) {
			return
		}
		if time.Now().After(bound) {
			t.Fatalf("watch streams %d (before: %d, counted: %v); goroutines: %v", now, streams, counted, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
