package etcdtest

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// ShortDeadlines calls open with contexts whose deadlines are 0–5 ms, so
// that many end while open is under way, and checks afterwards that
// everything the calls started was released. open returns nil when it
// opened (and closed) what it opens, or the error of an open its deadline
// ended. Every seventh call gets 10 s, so some open even on an external
// server or a loaded machine. It keeps going until it made 200 calls, 50
// ended and 20 opened (within 2 minutes), then waits (at most a minute)
// until the goroutines started meanwhile ended and the embedded servers
// serve no more watch streams than before.
func ShortDeadlines(t testing.TB, open func(ctx context.Context, i int) error) (ended, opened int) {
	t.Helper()
	streams, counted := WatchStreams()
	baseline := goleak.IgnoreCurrent()
	bound := time.Now().Add(2 * time.Minute)
	for i := 0; i < 200 || ended < 50 || opened < 20; i++ {
		if time.Now().After(bound) {
			t.Fatalf("after %d calls: %d ended by their deadline, %d opened", i, ended, opened)
		}
		wait := time.Duration(i%6) * time.Millisecond
		if i%7 == 6 {
			wait = 10 * time.Second
		}
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		if err := open(ctx, i); err != nil {
			ended++
		} else {
			opened++
		}
		cancel()
	}
	requireSettled(t, baseline, streams, counted)
	return ended, opened
}

// requireSettled waits (a bounded time) until the goroutines started since
// baseline ended and the embedded servers serve at most streams watch
// streams (when counted).
func requireSettled(t testing.TB, baseline goleak.Option, streams int, counted bool) {
	t.Helper()
	bound := time.Now().Add(time.Minute)
	for {
		now, _ := WatchStreams()
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
