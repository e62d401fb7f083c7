package etcd

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/internal/etcdpage"
	"github.com/zlink-systems/authority/provider/etcd/preflight"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/metadata"
)

var _ authority.RowFeed = (*Store)(nil)

// The row feed (authority.RowFeed).
//
// A feed is one etcd watch of the rows/ range under the feed's prefix, from
// the revision after its start, with progress notifications, on a gRPC watch
// stream of its own (a metadata value only it carries), so that
// RequestProgress concerns its watch alone: etcd answers a progress request
// only once every watch of the stream has caught up, with the revision up to
// which it has sent them everything. Only rows/ keys are decoded, through
// schema.DecodeRow; keys elsewhere in the namespace are outside the range.
//
// A feed with List first reads every row of the range at one revision (a
// streamed range, or pages at that revision; a compaction between pages
// restarts the listing) and watches from that revision + 1.
//
// A compaction past the feed's position ends it with
// authority.ErrFeedCompacted; a watch that fails otherwise (lost leader,
// store closed) ends it with the error, and the consumer resumes from the
// last batch's Revision. The feed checks that revisions only move forward:
// a duplicate or an earlier revision ends it with ErrUnavailable rather than
// reaching the consumer.

// feedListAttempts bounds the listings a feed's start retries when a
// compaction interrupts one.
const feedListAttempts = 3

// WatchRows opens a feed of the rows under req.Prefix (authority.RowFeed).
// The feed ends when ctx ends, on Close, or when the store closes; Close
// (and a WatchRows that fails) releases its gRPC watch stream. It watches
// on a clientv3.Watcher of its own on Config.Client's connection: a Watcher
// wrapper set on that client does not apply to feeds.
func (s *Store) WatchRows(ctx context.Context, req authority.FeedRequest) (authority.Feed, error) {
	if err := authority.ValidateFeedRequest(req); err != nil {
		return nil, err
	}
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	reliable, err := s.progressReliable(ctx)
	if err != nil {
		return nil, err
	}
	base := s.keys.RowsPrefix()
	f := &etcdFeed{s: s, base: base, from: base + req.Prefix, reliable: reliable, pos: req.After, keepBad: req.KeepUndecodable}
	switch {
	case req.List:
		if err := f.list(ctx); err != nil {
			return nil, err
		}
	case req.After == 0:
		rev, err := s.FeedRevision(ctx)
		if err != nil {
			return nil, err
		}
		f.pos = rev
		f.pending = append(f.pending, authority.FeedBatch{Kind: authority.FeedProgress, Revision: rev})
	}
	if err := f.watch(ctx); err != nil {
		return nil, err
	}
	return f, nil
}

// watch opens the feed's watch on a watcher of its own. clientv3 keeps a
// gRPC watch stream whose Watch call's context ended before the stream took
// the request (and one a progress request opens after the watch ended)
// until its watcher closes: a watcher per feed, closed with the feed, the
// store, or a failed open, releases every stream the feed opened.
func (f *etcdFeed) watch(ctx context.Context) error {
	s := f.s
	f.watcher = clientv3.NewWatcher(s.client)
	wctx := metadata.AppendToOutgoingContext(clientv3.WithRequireLeader(ctx), "authority-feed", uuid.NewString())
	f.wctx, f.cancel = context.WithCancel(wctx)
	f.stopLife = context.AfterFunc(s.life, f.release)
	opts := []clientv3.OpOption{clientv3.WithRange(prefixEnd(f.from)), clientv3.WithRev(f.pos + 1)}
	if f.reliable {
		// Before the fixes a progress notification can run ahead of events
		// the watch has not sent, and the client resumes a broken stream
		// after it: no notifications on such a server.
		opts = append(opts, clientv3.WithProgressNotify())
	}
	f.wch = f.watcher.Watch(f.wctx, f.from, opts...)
	if err := ctx.Err(); err != nil {
		_ = f.Close()
		return err
	}
	if s.life.Err() != nil {
		_ = f.Close()
		return authority.ErrClosed
	}
	return nil
}

// FeedRevision returns the store's current revision, read linearizably with
// a Get of one key that holds nothing (authority.RowFeed).
func (s *Store) FeedRevision(ctx context.Context) (int64, error) {
	if err := s.begin(ctx); err != nil {
		return 0, err
	}
	rctx, cancel := s.requestContext(ctx)
	defer cancel()
	resp, err := s.kv.Get(rctx, s.keys.Namespace(), clientv3.WithCountOnly())
	if err != nil {
		return 0, mapError(err, false)
	}
	return resp.Header.Revision, nil
}

// progressReliable reports whether the server's progress notifications can
// be trusted: etcd 3.6 and later, 3.5.13 and later, 3.4.31 and later
// (etcd-io/etcd#15220, #17557). It asks the first endpoint.
func (s *Store) progressReliable(ctx context.Context) (bool, error) {
	eps := s.client.Endpoints()
	if len(eps) == 0 {
		return false, nil
	}
	rctx, cancel := s.requestContext(ctx)
	defer cancel()
	st, err := s.client.Status(rctx, eps[0])
	if err != nil {
		return false, mapError(err, false)
	}
	return ProgressNotifyReliable(st.Version), nil
}

// ProgressNotifyReliable reports whether an etcd server of version v sends
// progress notifications only once the watch has been sent every event up
// to their revision: 3.4.31+, 3.5.13+ and 3.6+ (etcd-io/etcd#15220 and the
// follow-up #17557). A read view refuses consistent reads from memory on
// older servers and reads from etcd instead.
func ProgressNotifyReliable(v string) bool {
	v = strings.TrimPrefix(strings.TrimSpace(v), "v")
	switch {
	case strings.HasPrefix(v, "3.4."):
		return preflight.ServerVersionAtLeast(v, preflight.RecommendedServer34)
	case strings.HasPrefix(v, "3.5."):
		return preflight.ServerVersionAtLeast(v, preflight.RecommendedServer35)
	}
	return preflight.ServerVersionAtLeast(v, "3.6.0")
}

// etcdFeed is an open feed of an etcd store.
type etcdFeed struct {
	s        *Store
	base     string // the rows/ prefix
	from     string // the watched range's start: base + the feed's prefix
	reliable bool
	keepBad  bool // FeedRequest.KeepUndecodable

	watcher  clientv3.Watcher // the feed's own (see watch)
	wctx     context.Context
	cancel   context.CancelFunc
	stopLife func() bool
	wch      clientv3.WatchChan

	// used by Next only
	pos     int64
	pending []authority.FeedBatch
	err     error

	closeOnce sync.Once
	closed    bool
	mu        sync.Mutex
}

// list reads every row of the range at one revision into pending listing
// batches, and sets pos to that revision.
func (f *etcdFeed) list(ctx context.Context) error {
	end := prefixEnd(f.from)
	var kvs []*mvccpb.KeyValue
	var rev int64
	var err error
	for attempt := 0; attempt < feedListAttempts; attempt++ {
		rctx, cancel := f.s.requestContext(ctx)
		kvs, rev, err = f.s.readAllRows(rctx, f.from, end)
		cancel()
		if !errors.Is(err, rpctypes.ErrCompacted) {
			break
		}
	}
	if err != nil {
		return mapError(err, false)
	}
	f.pos = rev
	now := f.s.clock.Now()
	for len(kvs) > 0 {
		n := min(len(kvs), feedBatchMax)
		b := authority.FeedBatch{Kind: authority.FeedListed, Revision: rev, Events: make([]authority.FeedEvent, 0, n)}
		for _, kv := range kvs[:n] {
			ev, err := f.decode(kv, false, now)
			if err != nil {
				return err
			}
			ev.Kind, ev.Revision = authority.FeedCreated, rev
			b.Events = append(b.Events, ev)
		}
		f.pending = append(f.pending, b)
		kvs = kvs[n:]
	}
	f.pending = append(f.pending, authority.FeedBatch{Kind: authority.FeedSynced, Revision: rev})
	return nil
}

// feedBatchMax bounds the events of one listing batch.
const feedBatchMax = 1000

// readAllRows reads [from, end) at one revision: streamed when the server
// can, else in pages at the first page's revision.
func (s *Store) readAllRows(ctx context.Context, from, end string) ([]*mvccpb.KeyValue, int64, error) {
	if p, ok, err := s.stream(ctx, from, end, 0, math.MaxInt64); ok {
		return p.Kvs, p.Revision, err
	}
	first, err := etcdpage.Read(ctx, s.kv, from, end, 0, feedBatchMax)
	if err != nil || !first.More || len(first.Kvs) == 0 {
		return first.Kvs, first.Revision, err
	}
	rest, err := etcdpage.Rest(ctx, s.kv, string(first.Kvs[len(first.Kvs)-1].Key), end, first.Revision, feedBatchMax)
	return append(first.Kvs, rest...), first.Revision, err
}

// decode turns a watched or listed key-value into an event (its Kind from
// del and the key's history, its Revision the value's ModRevision).
func (f *etcdFeed) decode(kv *mvccpb.KeyValue, del bool, now time.Time) (authority.FeedEvent, error) {
	key := authority.Key(strings.TrimPrefix(string(kv.Key), f.base))
	ev := authority.FeedEvent{Key: key, Revision: kv.ModRevision}
	if del {
		ev.Kind = authority.FeedRemoved
		return ev, nil
	}
	ev.Kind = authority.FeedUpdated
	if kv.CreateRevision == kv.ModRevision {
		ev.Kind = authority.FeedCreated
	}
	r, err := schema.DecodeRow(key, kv)
	if err != nil {
		if f.keepBad && errors.Is(err, authority.ErrCorrupt) {
			ev.Undecodable = err
			return ev, nil
		}
		return authority.FeedEvent{}, err
	}
	ev.Snapshot = r.Snapshot(now)
	return ev, nil
}
