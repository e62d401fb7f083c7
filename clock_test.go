package authority_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
)

// steppingClock returns wall times that carry a monotonic reading (as
// time.Now does) while its wall time steps as told.
type steppingClock struct{ wall time.Time }

func (c *steppingClock) Now() time.Time { return time.Now().Add(c.wall.Sub(time.Now().Round(0))) }

func TestMonotonicClockHoldsThroughAStepBack(t *testing.T) {
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	manual := authority.NewManualClock(start)
	c := authority.NewMonotonicClock(manual)
	require.Same(t, c, authority.NewMonotonicClock(c))
	require.Equal(t, start, c.Now())
	manual.Advance(time.Hour)
	require.Equal(t, start.Add(time.Hour), c.Now())
	manual.Advance(-30 * time.Minute) // an NTP step back
	require.Equal(t, start.Add(time.Hour), c.Now(), "held at its latest reading")
	manual.Advance(45 * time.Minute)
	require.Equal(t, start.Add(75*time.Minute), c.Now(), "follows again once past it")
}

func TestMonotonicClockComparesWallTime(t *testing.T) {
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	wall := &steppingClock{wall: start.Add(time.Hour)}
	c := authority.NewMonotonicClock(wall)
	first := c.Now()
	wall.wall = start // a step back of the wall clock; the monotonic reading still advances
	got := c.Now()
	require.False(t, got.Round(0).Before(first.Round(0)), "wall time went back: %v after %v", got, first)
}
