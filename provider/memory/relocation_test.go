package memory

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
)

func TestRelocationStore(t *testing.T) {
	ctx := context.Background()
	clock := authority.NewManualClock(testEpoch)
	r := NewRelocationStore(clock)
	data := []byte("envelope")
	receipt, err := r.PutNew(ctx, data, time.Minute)
	require.NoError(t, err)
	require.Equal(t, testEpoch, receipt.StoreNow)
	require.Equal(t, testEpoch.Add(time.Minute), receipt.ExpiresAt)
	data[0] = 'X' // the store kept its own copy
	got, err := r.Read(ctx, receipt.Reference)
	require.NoError(t, err)
	require.Equal(t, authority.KindFound, got.Kind)
	require.Equal(t, []byte("envelope"), got.Bytes)
	got.Bytes[0] = 'Y' // and hands out copies
	got, _ = r.Read(ctx, receipt.Reference)
	require.Equal(t, []byte("envelope"), got.Bytes)

	other, err := r.PutNew(ctx, data, time.Minute)
	require.NoError(t, err)
	require.NotEqual(t, receipt.Reference, other.Reference)
	require.GreaterOrEqual(t, len(other.Reference), 22, "128 random bits")

	require.NoError(t, r.Delete(ctx, receipt.Reference))
	require.NoError(t, r.Delete(ctx, receipt.Reference), "deleting a missing blob")
	got, err = r.Read(ctx, receipt.Reference)
	require.NoError(t, err)
	require.Equal(t, authority.KindMissing, got.Kind)
	missing, err := r.Read(ctx, "mem-unknown")
	require.NoError(t, err)
	require.Equal(t, authority.KindMissing, missing.Kind)

	empty, err := r.PutNew(ctx, nil, time.Minute)
	require.NoError(t, err)
	got, _ = r.Read(ctx, empty.Reference)
	require.Equal(t, authority.KindFound, got.Kind)
	require.Empty(t, got.Bytes)

	// Expiry: reads miss at the deadline; the next put sweeps.
	clock.Advance(time.Minute)
	got, _ = r.Read(ctx, other.Reference)
	require.Equal(t, authority.KindMissing, got.Kind)
	require.Equal(t, 1, r.Len())
	_, err = r.PutNew(ctx, []byte("next"), time.Hour)
	require.NoError(t, err)
	require.Equal(t, 1, r.Len())
	require.Len(t, r.expiry, 1)
}

func TestRelocationStoreRejects(t *testing.T) {
	ctx := context.Background()
	r := NewRelocationStore(nil)
	_, err := r.PutNew(ctx, make([]byte, authority.MaxPayloadBytes+1), time.Minute)
	require.ErrorIs(t, err, authority.ErrInvalidArgument)
	_, err = r.PutNew(ctx, nil, 0)
	require.ErrorIs(t, err, authority.ErrInvalidArgument)
	_, err = r.Read(ctx, "")
	require.ErrorIs(t, err, authority.ErrInvalidArgument)
	require.ErrorIs(t, r.Delete(ctx, ""), authority.ErrInvalidArgument)
	require.Zero(t, r.Len())

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = r.PutNew(cancelled, nil, time.Minute)
	require.ErrorIs(t, err, context.Canceled)
	_, err = r.Read(cancelled, "x")
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, r.Delete(cancelled, "x"), context.Canceled)
	require.Zero(t, r.Len())
}

func TestLiveSet(t *testing.T) {
	var l LiveSet
	require.False(t, l.IsTargetLive(nodeA, 1, ownerA))
	l.Set(nodeA, 1, ownerA, false)
	l.Set(nodeA, 1, ownerA, true)
	require.True(t, l.IsTargetLive(nodeA, 1, ownerA))
	require.False(t, l.IsTargetLive(nodeA, 2, ownerA))
	require.False(t, l.IsTargetLive(nodeB, 1, ownerA))
	require.False(t, l.IsTargetLive(nodeA, 1, authority.OwnerToken{OwnerID: ownerA.OwnerID, LeaseGeneration: 2}))
	l.Set(nodeA, 1, ownerA, false)
	require.False(t, l.IsTargetLive(nodeA, 1, ownerA))
}

func TestNewDefaults(t *testing.T) {
	require.Panics(t, func() { New(Config{}) })
	s := New(Config{Liveness: NewLiveSet()})
	require.Equal(t, DefaultReservationRetention, s.retention)
	require.Equal(t, DefaultScanRetention, s.scanRetention)
	require.Equal(t, DefaultMaxPinnedScans, s.maxPins)
	require.IsType(t, &authority.MonotonicClock{}, s.clock, "the wall clock, read monotonically")
	require.WithinDuration(t, time.Now(), s.clock.Now(), time.Hour, "the wall clock by default")
	require.NotEqual(t, New(Config{Liveness: NewLiveSet()}).scope, s.scope)
}
