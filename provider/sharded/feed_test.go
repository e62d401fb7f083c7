package sharded_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	"github.com/zlink-systems/authority/provider/sharded"
	"github.com/zlink-systems/authority/view"
)

// TestViewReadsAreConsistentOverShards: a view on the sharded store answers
// a consistent read after a write in any shard with that write, from
// memory: it waits until its feed's position covers every shard's revision
// at the read, not until a sum of revisions. Here shard 1's watch responses
// arrive late (its client delays them) while shard 0 is written all along,
// so the feed's sum passes the read's before shard 1's write arrives: a view
// that waited for the sum would answer without that write.
func TestViewReadsAreConsistentOverShards(t *testing.T) {
	ctx := context.Background()
	shards := shardConfigs(t, clusterCount)
	shards[1].Client = servers[1].ClientWith(t, func(cfg *clientv3.Config) {
		cfg.DialOptions = append(cfg.DialOptions, grpc.WithStreamInterceptor(delayWatchResponses(time.Second)))
	})
	s := newStore(t, 0, sharded.Config{Shards: shards})
	fx := conformance.NewFixture(t, harnessFor(s, nil))
	v, err := view.New(ctx, s, view.Config{MaxWait: 2 * time.Minute})
	require.NoError(t, err)
	defer v.Close()
	busy, busyID := keyInShard(t, s, 0, "busy")
	row := fx.Active(authority.ObjectActor, busyID, conformance.TargetA)
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() { // shard 0 moves on all the time
		var err error
		for err == nil {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			var res authority.CompareExchangeResult
			res, err = s.CompareExchangeAuthority(ctx, busy, row.StoreVersion, authority.Put([]byte("busy")))
			if err == nil && res.Kind == authority.KindStored {
				row = res.Snapshot
			}
		}
		done <- err
	}()
	for i := range 4 {
		key, id := keyInShard(t, s, 1, fmt.Sprintf("w%d", i))
		want := fx.Active(authority.ObjectActor, id, conformance.TargetA)
		got, err := v.Read(ctx, key, view.Freshness{})
		require.NoError(t, err)
		require.False(t, got.FromStore, "the read fell back to the store")
		require.Equal(t, authority.KindSnapshot, got.Kind, "write %d in shard 1 not seen by a consistent read", i)
		conformance.RequireSameRow(t, want, got.Snapshot)
	}
	close(stop)
	require.NoError(t, <-done)
	page, err := v.List(ctx, "actor/", "", 100, view.Freshness{})
	require.NoError(t, err)
	require.Len(t, page.Items, 5)
}

// delayWatchResponses is a gRPC stream interceptor that hands every etcd
// watch response carrying events to the client d late (and so every
// response after it on its stream).
func delayWatchResponses(d time.Duration) grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		cs, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil || method != "/etcdserverpb.Watch/Watch" {
			return cs, err
		}
		return delayedStream{ClientStream: cs, d: d}, nil
	}
}

type delayedStream struct {
	grpc.ClientStream
	d time.Duration
}

func (s delayedStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if resp, ok := m.(*etcdserverpb.WatchResponse); err == nil && ok && len(resp.Events) > 0 {
		t := time.NewTimer(s.d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-s.Context().Done():
		}
	}
	return err
}

// TestFeedResumesAfterAPosition: a feed over shards resumes after a batch's
// Position; one revision (After) cannot say where, and is refused.
func TestFeedResumesAfterAPosition(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, clusterCount, sharded.Config{})
	fx := conformance.NewFixture(t, harnessFor(s, nil))
	feed, err := s.WatchRows(ctx, authority.FeedRequest{})
	require.NoError(t, err)
	start, err := feed.Next(ctx)
	require.NoError(t, err)
	require.Equal(t, authority.FeedProgress, start.Kind)
	require.Len(t, start.Position, clusterCount)
	require.NoError(t, feed.Close())
	var want []authority.Key
	for i := range clusterCount {
		key, id := keyInShard(t, s, i, "after-close")
		fx.Active(authority.ObjectActor, id, conformance.TargetA)
		want = append(want, key)
	}
	_, err = s.WatchRows(ctx, authority.FeedRequest{After: start.Revision})
	require.ErrorIs(t, err, authority.ErrInvalidArgument)
	require.ErrorContains(t, err, "AfterPosition")
	resumed, err := s.WatchRows(ctx, authority.FeedRequest{AfterPosition: start.Position})
	require.NoError(t, err)
	defer resumed.Close()
	created := map[authority.Key]bool{}
	for len(created) < len(want) {
		b, err := resumed.Next(ctx)
		require.NoError(t, err)
		for _, ev := range b.Events {
			if ev.Kind == authority.FeedCreated {
				created[ev.Key] = true
			}
		}
	}
	for _, k := range want {
		require.True(t, created[k], "%s not delivered", k)
	}
}

// TestFeedShortDeadlinesReleaseStreams opens feeds over every shard with
// deadlines of 0–5 ms: every shard's watch stream and every goroutine the
// merged feed started is released.
func TestFeedShortDeadlinesReleaseStreams(t *testing.T) {
	s := newStore(t, clusterCount, sharded.Config{})
	warm, err := s.WatchRows(context.Background(), authority.FeedRequest{})
	require.NoError(t, err)
	require.NoError(t, warm.Close())
	ended, opened := etcdtest.ShortDeadlines(t, func(ctx context.Context, i int) error {
		f, err := s.WatchRows(ctx, authority.FeedRequest{Prefix: "actor/", List: i%2 == 0})
		if err == nil {
			_, err = f.Next(ctx)
			_ = f.RequestProgress(context.Background())
			require.NoError(t, f.Close())
		}
		if err != nil {
			require.True(t, ctx.Err() != nil || status.Code(errors.Unwrap(err)) == codes.DeadlineExceeded ||
				strings.Contains(err.Error(), "DeadlineExceeded") || errors.Is(err, context.DeadlineExceeded),
				"a feed failed, not by its deadline: %v", err)
		}
		return err
	})
	t.Logf("%d opens ended by their deadline, %d opened", ended, opened)
}

// TestOpenShortDeadlinesLeaveNothing opens and closes stores over every
// shard with deadlines of 0–5 ms: whatever a cut-short New started is
// released.
func TestOpenShortDeadlinesLeaveNothing(t *testing.T) {
	shards := shardConfigs(t, clusterCount)
	newStore(t, 0, sharded.Config{Shards: shards}) // the map exists
	etcdtest.ShortDeadlines(t, func(ctx context.Context, i int) error {
		s, err := sharded.New(ctx, sharded.Config{Shards: shards})
		if err == nil {
			require.NoError(t, s.Close())
		}
		return err
	})
}

// TestClosedStoreRefuses: after Close every operation is ErrClosed, and an
// open feed ends with it.
func TestClosedStoreRefuses(t *testing.T) {
	ctx := context.Background()
	s, err := sharded.New(ctx, sharded.Config{Shards: shardConfigs(t, clusterCount)})
	require.NoError(t, err)
	feed, err := s.WatchRows(ctx, authority.FeedRequest{})
	require.NoError(t, err)
	defer feed.Close()
	_, err = feed.Next(ctx)
	require.NoError(t, err)
	lease, err := s.Registry().Acquire(ctx, conformance.NodeA, 1, "closing", 10*time.Second)
	require.NoError(t, err)
	require.NoError(t, s.Close())
	select {
	case <-lease.Done():
	case <-time.After(time.Minute):
		t.Fatal("the owner lease's Done stayed open after Close")
	}
	_, err = feed.Next(ctx)
	require.ErrorIs(t, err, authority.ErrClosed)
	_, err = s.ReadAuthority(ctx, "actor/x")
	require.ErrorIs(t, err, authority.ErrClosed)
	_, err = s.ListAuthorities(ctx, "", "", 10)
	require.ErrorIs(t, err, authority.ErrClosed)
	_, err = s.Registry().Acquire(ctx, conformance.NodeA, 1, "closing", 10*time.Second)
	require.ErrorIs(t, err, authority.ErrClosed)
	require.NoError(t, s.Close(), "Close twice")
}

// failingFeedStore is the sharded store whose first feed fails after its
// first batches (as a lost stream would), for a view to resume.
type failingFeedStore struct {
	*sharded.Store
	opened atomic.Int64
}

func (s *failingFeedStore) WatchRows(ctx context.Context, req authority.FeedRequest) (authority.Feed, error) {
	f, err := s.Store.WatchRows(ctx, req)
	if err != nil || s.opened.Add(1) > 1 {
		return f, err
	}
	return &failAfter{Feed: f, left: 3}, nil
}

// failAfter passes left batches on, then fails with ErrUnavailable.
type failAfter struct {
	authority.Feed
	left int
}

func (f *failAfter) Next(ctx context.Context) (authority.FeedBatch, error) {
	if f.left == 0 {
		return authority.FeedBatch{}, authority.Wrap(authority.ErrUnavailable, "test: the feed's stream broke", nil)
	}
	f.left--
	return f.Feed.Next(ctx)
}

// TestViewResumesAfterAPosition: a view whose feed over shards fails
// resumes it after the position it applied (not after a revision, which a
// store of several shards refuses), and answers from memory again.
func TestViewResumesAfterAPosition(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, clusterCount, sharded.Config{})
	fx := conformance.NewFixture(t, harnessFor(s, nil))
	store := &failingFeedStore{Store: s}
	v, err := view.New(ctx, store, view.Config{MaxWait: 2 * time.Minute})
	require.NoError(t, err)
	defer v.Close()
	for i := range 3 * clusterCount {
		key, id := keyInShard(t, s, i%clusterCount, fmt.Sprintf("resume%d", i))
		want := fx.Active(authority.ObjectActor, id, conformance.TargetA)
		got, err := v.Read(ctx, key, view.Freshness{})
		require.NoError(t, err)
		require.False(t, got.FromStore, "read %d fell back to the store", i)
		conformance.RequireSameRow(t, want, got.Snapshot)
	}
	st := v.Stats()
	require.GreaterOrEqual(t, st.Resumes, int64(1), "the view never resumed its feed")
	require.Zero(t, st.Relists, "the view listed again instead of resuming")
}
