package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	authority "github.com/zlink-systems/authority"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
)

// disconnectGrace is how long the connection may be down before watch
// warns (a brief reconnect says nothing).
const disconnectGrace = time.Second

// runWatch streams the changes of the rows whose key starts with prefix
// from rev (0: now) through the store's typed row feed, count of them (0:
// until stopped). While etcd cannot be reached it warns on stderr; when it
// is back it says whether changes were missed (compacted meanwhile), and a
// compacted gap is named and skipped.
func runWatch(ctx context.Context, g *globals, prefix string, rev int64, count int) error {
	s, c, done, err := g.store(ctx, false)
	if err != nil {
		return err
	}
	defer done()
	g.warnIfEmpty(ctx, c)
	if g.output == outputTable || g.output == outputWide {
		fmt.Fprintf(g.stdout, "%-8s %-7s %-40s %s\n", "REV", "TYPE", "KEY", "DETAIL")
	}
	w := &watcher{g: g, c: c, s: s, prefix: prefix, count: count, after: max(rev-1, 0)}
	if rev == 1 {
		w.after = 1 // revision 1 holds no write: "after 1" replays everything
	}
	mctx, stopMonitor := context.WithCancel(ctx)
	defer stopMonitor()
	go w.monitor(mctx, c.ActiveConnection())
	for {
		err := w.watch(ctx)
		if ctx.Err() != nil || errors.Is(err, errWatchDone) {
			return nil // the user stopped it, or --count changes came
		}
		oldest, compacted := etcdstore.FeedCompactRevision(err)
		if !compacted || (w.seen == 0 && rev > 0) {
			if compacted {
				return fmt.Errorf("watch: --rev %d is compacted (the oldest revision etcd still holds is %d): %w", rev, oldest, err)
			}
			return err
		}
		fmt.Fprintf(g.stderr, "warning: missed changes: revisions %d..%d were compacted before the watch read them; going on from %d\n",
			w.after+1, oldest-1, oldest)
		w.after = oldest - 1
	}
}

// watcher is one watch command's state.
type watcher struct {
	g      *globals
	c      *clientv3.Client
	s      *etcdstore.Store
	prefix string // of authority keys
	count  int
	// after is the revision the feed resumes after (0: now); seen the
	// changes printed.
	after int64
	seen  int
	// mu guards last, the revision of the last change printed.
	mu   sync.Mutex
	last int64
}

// watch runs one feed until it ends: errWatchDone after --count changes,
// a compaction (authority.ErrFeedCompacted), or another error.
func (w *watcher) watch(ctx context.Context) error {
	feed, err := w.s.WatchRows(ctx, authority.FeedRequest{Prefix: w.prefix, After: w.after, KeepUndecodable: true})
	if err != nil {
		return fmt.Errorf("watch: %w", err)
	}
	defer feed.Close()
	for {
		b, err := feed.Next(ctx)
		if ctx.Err() != nil {
			return nil // the user stopped it (Ctrl-C, SIGTERM): not a failure
		}
		if err != nil {
			return fmt.Errorf("watch: %w", err)
		}
		for _, ev := range b.Events {
			if err := w.print(ev); err != nil {
				return err
			}
			if w.count > 0 && w.seen >= w.count {
				return errWatchDone
			}
		}
		w.after = b.Revision
	}
}

// errWatchDone ends a watch that printed --count changes.
var errWatchDone = errors.New("done")

// print writes one change and remembers its revision.
func (w *watcher) print(ev authority.FeedEvent) error {
	v := eventView{Revision: ev.Revision, Type: strings.ToUpper(string(ev.Kind)), Key: string(ev.Key)}
	switch {
	case ev.Undecodable != nil:
		fmt.Fprintf(w.g.stderr, "warning: %v\n", ev.Undecodable)
	case ev.Snapshot != nil:
		rv := viewRow(ev.Key, ev.Snapshot)
		v.Row = &rv
	}
	if err := writeEvent(w.g, v); err != nil {
		return err
	}
	w.seen++
	w.mu.Lock()
	w.last = ev.Revision
	w.mu.Unlock()
	return nil
}

// monitor follows the client's connection: once it has been down for
// disconnectGrace it warns on stderr, and when it is back it says whether
// the watch can still replay what happened meanwhile.
func (w *watcher) monitor(ctx context.Context, conn *grpc.ClientConn) {
	state := conn.GetState()
	var downSince time.Time
	warned := false
	for {
		changed := make(chan bool, 1)
		wait := ctx
		var cancel context.CancelFunc = func() {}
		if !downSince.IsZero() && !warned {
			wait, cancel = context.WithDeadline(ctx, downSince.Add(disconnectGrace))
		}
		go func() { changed <- conn.WaitForStateChange(wait, state) }()
		ok := <-changed
		cancel()
		if ctx.Err() != nil {
			return
		}
		if ok {
			state = conn.GetState()
		}
		switch {
		case state == connectivity.Ready && warned:
			w.reconnected(ctx, time.Since(downSince))
			downSince, warned = time.Time{}, false
		case state == connectivity.Ready:
			downSince = time.Time{}
		case state == connectivity.Shutdown:
			return
		case downSince.IsZero():
			downSince = time.Now()
		case !warned && time.Since(downSince) >= disconnectGrace:
			warned = true
			fmt.Fprintf(w.g.stderr, "warning: disconnected from etcd (%s) since %s; the watch resumes when it is back\n",
				strings.Join(w.c.Endpoints(), ","), downSince.UTC().Format(time.RFC3339))
		}
	}
}

// reconnected says whether the changes made while the watch was
// disconnected can still be replayed: they can unless etcd compacted the
// revision after the last change printed.
func (w *watcher) reconnected(ctx context.Context, down time.Duration) {
	w.mu.Lock()
	last := w.last
	w.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, w.g.dialTimeout)
	defer cancel()
	rows := schema.Prefix(w.g.namespace, schema.EntryRow) + w.prefix
	resp, err := w.c.Get(ctx, rows, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		fmt.Fprintf(w.g.stderr, "note: reconnected to etcd after %s; cannot tell yet whether changes were missed: %v\n", down.Truncate(time.Millisecond), err)
		return
	}
	if last == 0 {
		fmt.Fprintf(w.g.stderr, "note: reconnected to etcd after %s (revision %d); nothing missed: the watch goes on from where it was\n",
			down.Truncate(time.Millisecond), resp.Header.Revision)
		return
	}
	_, err = w.c.Get(ctx, rows, clientv3.WithPrefix(), clientv3.WithCountOnly(), clientv3.WithRev(last))
	switch {
	case errors.Is(err, rpctypes.ErrCompacted):
		fmt.Fprintf(w.g.stderr, "note: reconnected to etcd after %s; changes after revision %d were compacted meanwhile: some may be missed (named when the watch resumes)\n",
			down.Truncate(time.Millisecond), last)
	case err != nil:
		fmt.Fprintf(w.g.stderr, "note: reconnected to etcd after %s; cannot tell whether changes were missed: %v\n", down.Truncate(time.Millisecond), err)
	default:
		fmt.Fprintf(w.g.stderr, "note: reconnected to etcd after %s; nothing missed: the watch replays every change after revision %d (etcd is at %d)\n",
			down.Truncate(time.Millisecond), last, resp.Header.Revision)
	}
}
