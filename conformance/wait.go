package conformance

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
)

// waitBound bounds every wait that must end; it is never reached by a
// correct store and is not a timing assertion.
const waitBound = 30 * time.Second

// RunTestWaitForChange checks the optional authority.ChangeWaiter: it
// returns at once when the row already changed, wakes on a later write, and
// honours its context.
func RunTestWaitForChange(ctx context.Context, t *testing.T, f Factory) {
	waiter := func(t *testing.T, fx *Fixture) authority.ChangeWaiter {
		t.Helper()
		w, ok := fx.Store().(authority.ChangeWaiter)
		if !ok {
			t.Skip("provider does not implement authority.ChangeWaiter")
		}
		return w
	}
	wait := func(w authority.ChangeWaiter, key authority.Key, seen authority.StoreVersion) error {
		ctx, cancel := context.WithTimeout(ctx, waitBound)
		defer cancel()
		return w.WaitForChange(ctx, key, seen)
	}
	// background starts a wait and returns its result channel.
	background := func(ctx context.Context, w authority.ChangeWaiter, key authority.Key, seen authority.StoreVersion) <-chan error {
		done := make(chan error, 1)
		go func() { done <- w.WaitForChange(ctx, key, seen) }()
		return done
	}
	result := func(t *testing.T, done <-chan error) error {
		t.Helper()
		select {
		case err := <-done:
			return err
		case <-time.After(waitBound):
			t.Fatal("WaitForChange did not return")
			return nil
		}
	}
	runSubtests(ctx, t, f, []subtest{
		{"ReturnsWhenAlreadyChanged", func(t *testing.T, fx *Fixture) {
			w := waiter(t, fx)
			s := fx.Active(authority.ObjectUserSpot, "s1", TargetA)
			key := fx.Key(authority.ObjectUserSpot, "s1")
			fx.Put(key, s.StoreVersion, []byte("v2"))
			require.NoError(t, wait(w, key, s.StoreVersion))
		}},
		{"ReturnsWhenAbsentRowExists", func(t *testing.T, fx *Fixture) {
			w := waiter(t, fx)
			r := fx.Reserve(authority.ObjectActor, "a1", TargetA)
			require.NoError(t, wait(w, r.Key, ""))
		}},
		{"ReturnsWhenAlreadyDeleted", func(t *testing.T, fx *Fixture) {
			w := waiter(t, fx)
			s := fx.Active(authority.ObjectUserSpot, "s1", TargetA)
			key := fx.Key(authority.ObjectUserSpot, "s1")
			fx.Delete(key, s.StoreVersion)
			require.NoError(t, wait(w, key, s.StoreVersion))
		}},
		{"WakesOnLaterWrite", func(t *testing.T, fx *Fixture) {
			w := waiter(t, fx)
			s := fx.Active(authority.ObjectUserSpot, "s1", TargetA)
			key := fx.Key(authority.ObjectUserSpot, "s1")
			ctx, cancel := context.WithTimeout(fx.Ctx(), waitBound)
			defer cancel()
			done := background(ctx, w, key, s.StoreVersion)
			fx.Put(key, s.StoreVersion, []byte("v2"))
			require.NoError(t, result(t, done))
		}},
		{"WakesOnCreation", func(t *testing.T, fx *Fixture) {
			w := waiter(t, fx)
			key := fx.Key(authority.ObjectActor, "a1")
			ctx, cancel := context.WithTimeout(fx.Ctx(), waitBound)
			defer cancel()
			done := background(ctx, w, key, "")
			fx.Reserve(authority.ObjectActor, "a1", TargetA)
			require.NoError(t, result(t, done))
		}},
		{"WakesOnRemoveAllByOwner", func(t *testing.T, fx *Fixture) {
			w := waiter(t, fx)
			s := fx.Active(authority.ObjectActor, "a1", TargetA)
			ctx, cancel := context.WithTimeout(fx.Ctx(), waitBound)
			defer cancel()
			done := background(ctx, w, fx.Key(authority.ObjectActor, "a1"), s.StoreVersion)
			n, err := fx.Store().RemoveAllByOwner(fx.Ctx(), OwnerA)
			require.NoError(t, err)
			require.Equal(t, int64(1), n)
			require.NoError(t, result(t, done))
		}},
		{"CancelledContext", func(t *testing.T, fx *Fixture) {
			w := waiter(t, fx)
			s := fx.Active(authority.ObjectUserSpot, "s1", TargetA)
			ctx, cancel := context.WithCancel(fx.Ctx())
			cancel()
			err := w.WaitForChange(ctx, fx.Key(authority.ObjectUserSpot, "s1"), s.StoreVersion)
			require.Error(t, err)
			require.True(t, errors.Is(err, context.Canceled), "error %v", err)
		}},
		{"CancelWhileWaiting", func(t *testing.T, fx *Fixture) {
			w := waiter(t, fx)
			s := fx.Active(authority.ObjectUserSpot, "s1", TargetA)
			ctx, cancel := context.WithCancel(fx.Ctx())
			done := background(ctx, w, fx.Key(authority.ObjectUserSpot, "s1"), s.StoreVersion)
			cancel()
			err := result(t, done)
			require.True(t, errors.Is(err, context.Canceled), "error %v", err)
		}},
		{"DeadlineWithoutChange", func(t *testing.T, fx *Fixture) {
			w := waiter(t, fx)
			s := fx.Active(authority.ObjectUserSpot, "s1", TargetA)
			// Writes to other rows do not wake the waiter.
			fx.Active(authority.ObjectUserSpot, "s2", TargetA)
			ctx, cancel := context.WithTimeout(fx.Ctx(), 50*time.Millisecond)
			defer cancel()
			err := w.WaitForChange(ctx, fx.Key(authority.ObjectUserSpot, "s1"), s.StoreVersion)
			require.True(t, errors.Is(err, context.DeadlineExceeded), "error %v", err)
		}},
	})
}
