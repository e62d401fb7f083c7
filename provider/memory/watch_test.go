package memory

import (
	"context"
	"runtime"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
)

// waitersOn returns how many WaitForChange calls are blocked on key.
func (e *env) waitersOn(key authority.Key) int {
	e.s.mu.Lock()
	defer e.s.mu.Unlock()
	if w := e.s.watches[key]; w != nil {
		return w.waiters
	}
	return 0
}

// awaitWaiters yields until n calls are blocked on key.
func (e *env) awaitWaiters(key authority.Key, n int) {
	for e.waitersOn(key) != n {
		runtime.Gosched()
	}
}

func TestWaitForChangeReturnsAtOnce(t *testing.T) {
	e := newEnv(t)
	key, ready := e.spot("s1")
	require.NoError(t, e.s.WaitForChange(e.ctx, key, "1"), "already at another version")
	require.NoError(t, e.s.WaitForChange(e.ctx, key, ""), "present, seen absent")
	require.NoError(t, e.s.WaitForChange(e.ctx, "user_spot/none", ready.StoreVersion), "absent, seen present")
	require.Zero(t, len(e.s.watches))
}

func TestWaitForChangeWakesOnWrite(t *testing.T) {
	e := newEnv(t)
	key, ready := e.spot("s1")
	const n = 8
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- e.s.WaitForChange(e.ctx, key, ready.StoreVersion)
		}()
	}
	e.awaitWaiters(key, n)
	// A write of another key wakes nobody.
	e.spot("s2")
	require.Equal(t, n, e.waitersOn(key))
	require.Equal(t, authority.KindStored, e.cas(key, ready.StoreVersion, authority.Put([]byte("x"))).Kind)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Zero(t, len(e.s.watches))
}

func TestWaitForChangeOnAbsentKey(t *testing.T) {
	e := newEnv(t)
	req := spotRequest("s1", target(nodeA, ownerA))
	key := mustKey(t, req.Key)
	done := make(chan error, 1)
	go func() { done <- e.s.WaitForChange(e.ctx, key, "") }()
	e.awaitWaiters(key, 1)
	require.Equal(t, authority.KindReserved, e.reserve(req).Kind)
	require.NoError(t, <-done)
}

func TestWaitForChangeCancelled(t *testing.T) {
	e := newEnv(t)
	key, ready := e.spot("s1")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	for range 2 {
		go func() { done <- e.s.WaitForChange(ctx, key, ready.StoreVersion) }()
	}
	e.awaitWaiters(key, 2)
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	require.ErrorIs(t, <-done, context.Canceled)
	require.Zero(t, len(e.s.watches), "the last waiter removes the watch")
	// A later write still works and nobody is left waiting.
	require.Equal(t, authority.KindStored, e.cas(key, ready.StoreVersion, authority.Put(nil)).Kind)
}

// TestWaitForChangeMissesNothing: a waiter following a row's versions one
// by one observes every write made by a concurrent writer, never blocking
// on a version already replaced.
func TestWaitForChangeMissesNothing(t *testing.T) {
	e := newEnv(t)
	key, ready := e.spot("s1")
	const writes = 500
	go func() {
		v := ready.StoreVersion
		for range writes {
			res, err := e.s.CompareExchangeAuthority(e.ctx, key, v, authority.Put(nil))
			if err != nil || res.Kind != authority.KindStored {
				t.Errorf("write: %v %v", res.Kind, err)
				return
			}
			v = res.Snapshot.StoreVersion
		}
	}()
	// A missed change would leave the waiter blocked (the test times out).
	seen, final := ready.StoreVersion, version(2+writes)
	for seen != final {
		require.NoError(t, e.s.WaitForChange(e.ctx, key, seen))
		cur := e.read(key)
		require.NotEqual(t, seen, cur.Snapshot.StoreVersion)
		seen = cur.Snapshot.StoreVersion
	}
}
