package txnkit

import (
	"context"
	"sync/atomic"
)

// AllEnded returns a context for work done on behalf of several callers at
// once (a batched write, a group of reservations): it carries the values of
// the first caller's context (gRPC metadata, tracing) and ends only when
// every caller's context has ended, or when release is called. Call release
// when the work is done.
func AllEnded(callers []context.Context) (ctx context.Context, release func()) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(callers[0]))
	left := atomic.Int64{}
	left.Store(int64(len(callers)))
	stops := make([]func() bool, len(callers))
	for i, c := range callers {
		stops[i] = context.AfterFunc(c, func() {
			if left.Add(-1) == 0 {
				cancel()
			}
		})
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel()
	}
}
