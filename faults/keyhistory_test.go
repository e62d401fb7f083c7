package faults_test

import (
	"context"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/zlink-systems/authority/provider/etcd/schema"
)

// keyHistory is an independent record of every change under a namespace,
// from a raw etcd watch the store under test has no part in: for each key
// the revisions it changed at (and when the watch saw them), and the most
// Actors the namespace's capacity entries held at any revision.
type keyHistory struct {
	cli    *clientv3.Client
	wctx   context.Context
	cancel context.CancelFunc
	done   chan struct{}
	capPfx string
	ns     string

	mu       sync.Mutex
	changes  map[string][]keyChange
	progress int64 // every change up to here is recorded
	advanced chan struct{}
	err      error
	held     map[string]int64 // capacity entry → Actors
	total    int64
	peak     int64
}

// keyChange is one change of a key.
type keyChange struct {
	rev int64
	del bool
	at  time.Time // when the watch delivered it
}

// startKeyHistory starts recording every change under ns from now on; t's
// cleanup stops it.
func startKeyHistory(t *testing.T, cli *clientv3.Client, ns string) *keyHistory {
	t.Helper()
	var rev int64
	eventually(t, "history start", func(ctx context.Context) error {
		resp, err := cli.Get(ctx, ns+"history-start")
		if err == nil {
			rev = resp.Header.Revision
		}
		return err
	})
	h := &keyHistory{cli: cli, done: make(chan struct{}), capPfx: schema.Prefix(ns, schema.EntryCapacity), ns: ns,
		changes: map[string][]keyChange{}, progress: rev, advanced: make(chan struct{}), held: map[string]int64{}}
	h.wctx, h.cancel = context.WithCancel(context.Background())
	wch := cli.Watch(h.wctx, ns, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	go h.follow(wch)
	t.Cleanup(func() { h.cancel(); <-h.done })
	return h
}

func (h *keyHistory) follow(wch clientv3.WatchChan) {
	defer close(h.done)
	for wr := range wch {
		h.mu.Lock()
		if err := wr.Err(); err != nil || wr.Canceled {
			if h.err == nil && h.wctx.Err() == nil {
				h.err = err
			}
			h.mu.Unlock()
			return
		}
		now := time.Now()
		for i, ev := range wr.Events {
			k := string(ev.Kv.Key)
			h.changes[k] = append(h.changes[k], keyChange{rev: ev.Kv.ModRevision, del: ev.Type == clientv3.EventTypeDelete, at: now})
			h.capacity(ev)
			if i == len(wr.Events)-1 || wr.Events[i+1].Kv.ModRevision != ev.Kv.ModRevision {
				h.peak = max(h.peak, h.total) // a revision is complete
			}
		}
		h.progress = max(h.progress, wr.Header.Revision)
		close(h.advanced)
		h.advanced = make(chan struct{})
		h.mu.Unlock()
	}
}

// capacity applies a change of a capacity entry to the running total
// (under mu).
func (h *keyHistory) capacity(ev *clientv3.Event) {
	k := string(ev.Kv.Key)
	if len(k) < len(h.capPfx) || k[:len(h.capPfx)] != h.capPfx {
		return
	}
	h.total -= h.held[k]
	delete(h.held, k)
	if ev.Type == clientv3.EventTypePut {
		e, err := schema.DecodeEntry(h.ns, ev.Kv)
		if err != nil || e.Capacity == nil {
			if h.err == nil {
				h.err = err
			}
			return
		}
		h.held[k] = e.Capacity.Vector.Actors
		h.total += h.held[k]
	}
}

// reached reports whether the watch recorded every change up to rev
// before ctx ended, asking it for its progress every second meanwhile (a
// loaded machine can take longer than any fixed wait).
func (h *keyHistory) reached(ctx context.Context, rev int64) bool {
	for {
		_ = h.cli.RequestProgress(h.wctx)
		timeout := time.NewTimer(time.Second)
		for again := false; !again; {
			h.mu.Lock()
			ok, ch := h.progress >= rev, h.advanced
			h.mu.Unlock()
			if ok {
				timeout.Stop()
				return true
			}
			select {
			case <-ch:
			case <-timeout.C:
				again = true
			case <-ctx.Done():
				timeout.Stop()
				return false
			case <-h.done: // the watch ended: it records nothing more
				timeout.Stop()
				h.mu.Lock()
				defer h.mu.Unlock()
				return h.progress >= rev
			}
		}
	}
}

// nextChange returns the revision of key's next change after its put at
// rev (1<<62 when none was recorded yet); ok is false when no put of key at
// rev was recorded.
func (h *keyHistory) nextChange(key string, rev int64) (next int64, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	cs := h.changes[key]
	for i, c := range cs {
		if c.rev == rev && !c.del {
			if i+1 < len(cs) {
				return cs[i+1].rev, true
			}
			return 1 << 62, true
		}
	}
	return 0, false
}

// changedAt returns when the watch saw key's first change after rev.
func (h *keyHistory) changedAt(key string, rev int64) (time.Time, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.changes[key] {
		if c.rev > rev {
			return c.at, true
		}
	}
	return time.Time{}, false
}

// stop waits until the watch recorded everything up to now, ends it and
// returns the most Actors the capacity entries held at any revision. The
// record must be whole: a watch that failed fails t.
func (h *keyHistory) stop(t *testing.T) int64 {
	t.Helper()
	var rev int64
	eventually(t, "history end", func(ctx context.Context) error {
		resp, err := h.cli.Get(ctx, h.ns+"history-end")
		if err == nil {
			rev = resp.Header.Revision
		}
		return err
	})
	h.reached(settle(t), rev)
	h.cancel()
	<-h.done
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.err != nil || h.progress < rev {
		t.Fatalf("the independent watch is not whole: %v (at %d of %d)", h.err, h.progress, rev)
	}
	return h.peak
}
