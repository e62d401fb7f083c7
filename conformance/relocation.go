package conformance

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
)

// RunTestRelocationStore checks the optional relocation blob store: put,
// read, delete, expiry, and input validation.
func RunTestRelocationStore(ctx context.Context, t *testing.T, f Factory) {
	store := func(t *testing.T, fx *Fixture) authority.RelocationStore {
		t.Helper()
		if fx.H.Relocation == nil {
			t.Skip("provider has no relocation store")
		}
		return fx.H.Relocation
	}
	put := func(t *testing.T, fx *Fixture, rs authority.RelocationStore, data []byte, retention time.Duration) authority.BlobReceipt {
		t.Helper()
		rec, err := rs.PutNew(fx.Ctx(), data, retention)
		require.NoError(t, err)
		require.NotEmpty(t, rec.Reference)
		return rec
	}
	read := func(t *testing.T, fx *Fixture, rs authority.RelocationStore, ref authority.BlobReference) authority.BlobReadResult {
		t.Helper()
		res, err := rs.Read(fx.Ctx(), ref)
		require.NoError(t, err)
		return res
	}
	runSubtests(ctx, t, f, []subtest{
		{"PutRead", func(t *testing.T, fx *Fixture) {
			rs := store(t, fx)
			rec := put(t, fx, rs, []byte("envelope"), time.Hour)
			require.True(t, rec.ExpiresAt.After(rec.StoreNow), "expires %v, now %v", rec.ExpiresAt, rec.StoreNow)
			require.False(t, rec.ExpiresAt.Before(rec.StoreNow.Add(time.Hour-time.Second)))
			res := read(t, fx, rs, rec.Reference)
			require.Equal(t, authority.KindFound, res.Kind)
			require.Equal(t, []byte("envelope"), res.Bytes)
		}},
		{"EmptyBlob", func(t *testing.T, fx *Fixture) {
			rs := store(t, fx)
			rec := put(t, fx, rs, nil, time.Hour)
			res := read(t, fx, rs, rec.Reference)
			require.Equal(t, authority.KindFound, res.Kind)
			require.Empty(t, res.Bytes)
		}},
		{"MaxBlob", func(t *testing.T, fx *Fixture) {
			rs := store(t, fx)
			big := make([]byte, authority.MaxPayloadBytes)
			big[0], big[len(big)-1] = 1, 2
			rec := put(t, fx, rs, big, time.Hour)
			require.Equal(t, big, read(t, fx, rs, rec.Reference).Bytes)
		}},
		{"DistinctReferences", func(t *testing.T, fx *Fixture) {
			rs := store(t, fx)
			a := put(t, fx, rs, []byte("same"), time.Hour)
			b := put(t, fx, rs, []byte("same"), time.Hour)
			require.NotEqual(t, a.Reference, b.Reference)
			require.NoError(t, rs.Delete(fx.Ctx(), a.Reference))
			require.Equal(t, authority.KindFound, read(t, fx, rs, b.Reference).Kind)
		}},
		{"DeleteThenMissing", func(t *testing.T, fx *Fixture) {
			rs := store(t, fx)
			rec := put(t, fx, rs, []byte("x"), time.Hour)
			require.NoError(t, rs.Delete(fx.Ctx(), rec.Reference))
			res := read(t, fx, rs, rec.Reference)
			require.Equal(t, authority.KindMissing, res.Kind)
			require.Empty(t, res.Bytes)
		}},
		{"DeleteMissingIsNoError", func(t *testing.T, fx *Fixture) {
			rs := store(t, fx)
			rec := put(t, fx, rs, []byte("x"), time.Hour)
			require.NoError(t, rs.Delete(fx.Ctx(), rec.Reference))
			require.NoError(t, rs.Delete(fx.Ctx(), rec.Reference))
		}},
		{"ReadUnknownMissing", func(t *testing.T, fx *Fixture) {
			rs := store(t, fx)
			rec := put(t, fx, rs, []byte("x"), time.Hour)
			require.Equal(t, authority.KindMissing, read(t, fx, rs, rec.Reference+"-other").Kind)
		}},
		{"ReturnsCopies", func(t *testing.T, fx *Fixture) {
			rs := store(t, fx)
			data := []byte("abc")
			rec := put(t, fx, rs, data, time.Hour)
			data[0] = 'X'
			got := read(t, fx, rs, rec.Reference)
			require.Equal(t, []byte("abc"), got.Bytes)
			got.Bytes[1] = 'Y'
			require.Equal(t, []byte("abc"), read(t, fx, rs, rec.Reference).Bytes)
		}},
		{"ExpiresAfterRetention", func(t *testing.T, fx *Fixture) {
			rs := store(t, fx)
			needClock(t, fx)
			rec := put(t, fx, rs, []byte("x"), time.Minute)
			fx.H.AdvanceClock(t, 30*time.Second)
			require.Equal(t, authority.KindFound, read(t, fx, rs, rec.Reference).Kind)
			fx.H.AdvanceClock(t, rec.ExpiresAt.Sub(fx.H.Now()))
			require.Equal(t, authority.KindMissing, read(t, fx, rs, rec.Reference).Kind)
		}},
		{"RejectsOversizedBlob", func(t *testing.T, fx *Fixture) {
			rs := store(t, fx)
			_, err := rs.PutNew(fx.Ctx(), tooBig, time.Hour)
			require.True(t, errors.Is(err, authority.ErrInvalidArgument), "error %v", err)
		}},
		{"RejectsRetentionOutOfRange", func(t *testing.T, fx *Fixture) {
			rs := store(t, fx)
			for _, d := range []time.Duration{0, -time.Second, authority.MaxRetention + time.Nanosecond} {
				_, err := rs.PutNew(fx.Ctx(), []byte("x"), d)
				require.True(t, errors.Is(err, authority.ErrInvalidArgument), "retention %v: error %v", d, err)
			}
		}},
	})
}
