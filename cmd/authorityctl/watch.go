package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/zlink-systems/authority/provider/etcd/schema"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
)

// disconnectGrace is how long the connection may be down before watch
// warns (a brief reconnect says nothing).
const disconnectGrace = time.Second

// runWatch streams the row changes under prefix from rev (0: now), count of
// them (0: until stopped). While etcd cannot be reached it warns on stderr;
// when it is back it says whether changes were missed (compacted meanwhile)
// and goes on from the oldest revision etcd still holds.
func runWatch(ctx context.Context, g *globals, prefix string, rev int64, count int) error {
	c, _, err := g.dial(ctx, false)
	if err != nil {
		return err
	}
	defer c.Close()
	if g.output == outputTable || g.output == outputWide {
		fmt.Fprintf(g.stdout, "%-8s %-7s %-40s %s\n", "REV", "TYPE", "KEY", "DETAIL")
	}
	w := &watcher{g: g, c: c, prefix: prefix, count: count, next: rev}
	mctx, stopMonitor := context.WithCancel(ctx)
	defer stopMonitor()
	go w.monitor(mctx, c.ActiveConnection())
	for {
		err := w.watch(ctx)
		if ctx.Err() != nil || errors.Is(err, errWatchDone) {
			return nil // the user stopped it, or --count changes came
		}
		var compacted *compactedError
		if !errors.As(err, &compacted) || (w.seen == 0 && rev > 0) {
			return err // --rev itself is compacted: the user's to change
		}
		fmt.Fprintf(g.stderr, "warning: missed changes: revisions %d..%d were compacted before the watch read them; going on from %d\n",
			w.next, compacted.oldest-1, compacted.oldest)
		w.next = compacted.oldest
	}
}

// compactedError is a watch refused because its start revision is
// compacted; oldest is the oldest revision etcd still holds.
type compactedError struct {
	oldest int64
	err    error
}

func (e *compactedError) Error() string { return e.err.Error() }
func (e *compactedError) Unwrap() error { return e.err }

// watcher is one watch command's state.
type watcher struct {
	g      *globals
	c      *clientv3.Client
	prefix string
	count  int
	// next is the revision to watch from (0: now); seen the changes
	// printed.
	next int64
	seen int
	// mu guards last, the revision of the last change printed.
	mu   sync.Mutex
	last int64
}

// watch runs one etcd watch until it ends: nil after --count changes, a
// *compactedError, or another error.
func (w *watcher) watch(ctx context.Context) error {
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	opts := []clientv3.OpOption{clientv3.WithPrefix()}
	if w.next > 0 {
		opts = append(opts, clientv3.WithRev(w.next))
	}
	for wr := range w.c.Watch(clientv3.WithRequireLeader(wctx), w.prefix, opts...) {
		if ctx.Err() != nil {
			return nil
		}
		if err := wr.Err(); err != nil {
			if errors.Is(err, rpctypes.ErrCompacted) {
				return &compactedError{oldest: wr.CompactRevision,
					err: fmt.Errorf("watch: --rev %d is compacted (the oldest revision etcd still holds is %d): %w", w.next, wr.CompactRevision, err)}
			}
			return fmt.Errorf("watch: %w", err)
		}
		for _, ev := range wr.Events {
			if err := w.print(ev); err != nil {
				return err
			}
			if w.count > 0 && w.seen >= w.count {
				return errWatchDone
			}
		}
	}
	if ctx.Err() != nil {
		return nil // the user stopped it (Ctrl-C, SIGTERM): not a failure
	}
	return errors.New("watch: the watch ended without an error (the client closed)")
}

// errWatchDone ends a watch that printed --count changes.
var errWatchDone = errors.New("done")

// print writes one change and remembers its revision.
func (w *watcher) print(ev *clientv3.Event) error {
	// the kinds of the typed row feed (authority.FeedEventKind)
	v := eventView{Revision: ev.Kv.ModRevision, Type: "UPDATED",
		Key: strings.TrimPrefix(string(ev.Kv.Key), schema.Prefix(w.g.namespace, schema.EntryRow))}
	if ev.IsCreate() {
		v.Type = "CREATED"
	}
	if ev.Type == clientv3.EventTypeDelete {
		v.Type = "REMOVED"
	} else if e, err := schema.DecodeEntry(w.g.namespace, ev.Kv); err == nil {
		rv := viewRow(e.Key, e.Snapshot)
		v.Row = &rv
	} else {
		fmt.Fprintf(w.g.stderr, "warning: %v\n", err)
	}
	if err := writeEvent(w.g, v); err != nil {
		return err
	}
	w.seen++
	w.mu.Lock()
	w.last = ev.Kv.ModRevision
	w.mu.Unlock()
	w.next = ev.Kv.ModRevision + 1
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
	resp, err := w.c.Get(ctx, w.prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		fmt.Fprintf(w.g.stderr, "note: reconnected to etcd after %s; cannot tell yet whether changes were missed: %v\n", down.Truncate(time.Millisecond), err)
		return
	}
	if last == 0 {
		fmt.Fprintf(w.g.stderr, "note: reconnected to etcd after %s (revision %d); nothing missed: the watch goes on from where it was\n",
			down.Truncate(time.Millisecond), resp.Header.Revision)
		return
	}
	_, err = w.c.Get(ctx, w.prefix, clientv3.WithPrefix(), clientv3.WithCountOnly(), clientv3.WithRev(last))
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
