package coordinator

import (
	"context"
	"time"

	authority "github.com/zlink-systems/authority"
)

// defaultPollInterval is the wait between reads when the store has no
// change feed.
const defaultPollInterval = 10 * time.Millisecond

// waitForChange returns once the row at key may have left version seen (the
// zero version meaning absent), or when ctx ends (returning ctx.Err()). It
// waits on the store's change feed when there is one, else sleeps one poll
// interval. A failing change feed degrades to one poll interval.
func waitForChange(ctx context.Context, store any, key authority.Key, seen authority.StoreVersion, poll time.Duration) error {
	if w, ok := store.(authority.ChangeWaiter); ok {
		err := w.WaitForChange(ctx, key, seen)
		if err == nil || ctx.Err() != nil {
			return ctx.Err()
		}
	}
	if poll <= 0 {
		poll = defaultPollInterval
	}
	t := time.NewTimer(poll)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// seenVersion is the version a read observed: the snapshot's, or the zero
// version for a missing row.
func seenVersion(r authority.ReadResult) authority.StoreVersion {
	if r.Kind == authority.KindSnapshot && r.Snapshot != nil {
		return r.Snapshot.StoreVersion
	}
	return ""
}
