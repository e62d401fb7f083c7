package memory

import (
	"context"

	authority "github.com/zlink-systems/authority"
)

// watch is the change signal of one key: closed on the key's next write.
// waiters counts the WaitForChange calls blocked on it, so that the last
// one to give up removes it.
type watch struct {
	ch      chan struct{}
	waiters int
}

// waitForChange returns once the row at key is no longer at version seen
// (the zero StoreVersion meaning "absent"), or with ctx's error when ctx
// ends first. It returns nil at once if the row already changed. It checks
// the version and registers under the store's lock, so no write after the
// call begins is missed; it starts no goroutine and polls nothing.
func (s *Store) waitForChange(ctx context.Context, key authority.Key, seen authority.StoreVersion) error {
	if err := authority.ValidateKey(key); err != nil {
		return err
	}
	if _, err := s.lock(ctx); err != nil {
		return err
	}
	r := s.row(key)
	if r == nil && seen != "" || r != nil && !r.versionIs(seen) {
		s.mu.Unlock()
		return nil
	}
	w := s.watches[key]
	if w == nil {
		w = &watch{ch: make(chan struct{})}
		s.watches[key] = w
	}
	w.waiters++
	s.mu.Unlock()

	select {
	case <-w.ch:
		return nil
	case <-ctx.Done():
		s.mu.Lock()
		defer s.mu.Unlock()
		select {
		case <-w.ch:
			// The key changed before we took the lock: report the change.
			return nil
		default:
		}
		w.waiters--
		if w.waiters == 0 {
			delete(s.watches, key)
		}
		return ctx.Err()
	}
}

// notify wakes the waiters on key. The caller holds s.mu.
func (s *Store) notify(key authority.Key) {
	if w := s.watches[key]; w != nil {
		close(w.ch)
		delete(s.watches, key)
	}
}
