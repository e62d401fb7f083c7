package memory

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
)

// signalClock is a ManualClock that closes armed at its next Now.
type signalClock struct {
	*authority.ManualClock
	mu    sync.Mutex
	armed chan struct{}
}

func (c *signalClock) Now() time.Time {
	t := c.ManualClock.Now()
	c.mu.Lock()
	if c.armed != nil {
		close(c.armed)
		c.armed = nil
	}
	c.mu.Unlock()
	return t
}

// arm returns a channel closed at the clock's next read.
func (c *signalClock) arm() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.armed = make(chan struct{})
	return c.armed
}

// TestCompletionTakesEffectAtItsLockTime: CompleteCreation validates (and
// hashes) its request before taking the store's lock, but checks the
// terminal's expiry and stamps its results at the time it holds the lock,
// as the seed did within one turn. A completion that waited past its
// terminal's expiry writes nothing; one that did not stamps the later time.
func TestCompletionTakesEffectAtItsLockTime(t *testing.T) {
	for _, life := range []time.Duration{10 * time.Second, 2 * time.Minute} {
		t.Run(life.String(), func(t *testing.T) {
			live := NewLiveSet()
			clock := &signalClock{ManualClock: authority.NewManualClock(testEpoch)}
			s := New(Config{Liveness: live, Clock: clock})
			live.Set(nodeA, 1, ownerA, true)
			e := &env{t: t, s: s, live: live, ctx: t.Context()}
			req := actorRequest("a1", target(nodeA, ownerA))
			res := e.reserve(req)
			require.Equal(t, authority.KindReserved, res.Kind)
			// the terminal has `life` left at the call's first clock read
			deadline := testEpoch.Add(-authority.CreationTerminalRetention + life)
			creq := authority.CompleteCreationRequest{
				Key: req.Key, ReservationID: res.ReservationID, ExpectedStoreVersion: res.Creating.StoreVersion,
				Target: req.Target, Completion: completion(authority.TerminalCreated, operation(1), deadline),
			}

			s.mu.Lock() // another operation holds the store for a minute
			armed := clock.arm()
			type outcome struct {
				res authority.CompleteCreationResult
				err error
			}
			done := make(chan outcome)
			go func() {
				r, err := s.CompleteCreation(t.Context(), creq)
				done <- outcome{r, err}
			}()
			<-armed
			clock.Advance(time.Minute)
			s.mu.Unlock()
			out := <-done
			now := clock.Now()

			if life < time.Minute {
				require.True(t, errors.Is(out.err, authority.ErrInvalidArgument), "%v", out.err)
				require.Equal(t, authority.AllocationReserved, e.read(mustKey(t, req.Key)).Snapshot.Allocation.State)
				read, err := s.ReadCreationTerminal(t.Context(), operation(1))
				require.NoError(t, err)
				require.Equal(t, authority.KindMissing, read.Kind)
				return
			}
			require.NoError(t, out.err)
			require.Equal(t, authority.KindCreated, out.res.Kind)
			require.Equal(t, now, out.res.Ready.StoreNow)
			require.Equal(t, now, out.res.Terminal.StoreNow)
			read, err := s.ReadCreationTerminal(t.Context(), operation(1))
			require.NoError(t, err)
			require.Equal(t, authority.KindFound, read.Kind)
		})
	}
}
