package fencing_test

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/fencing"
	"github.com/zlink-systems/authority/provider/memory"
)

func TestTokenTextRoundTrip(t *testing.T) {
	for _, tok := range []fencing.Token{1, 9, 10, 1234567, math.MaxInt64} {
		got, err := fencing.ParseToken(tok.String())
		require.NoError(t, err)
		require.Equal(t, tok, got)
		require.True(t, tok.Valid())
	}
	require.False(t, fencing.Token(0).Valid())
	require.False(t, fencing.Token(-1).Valid())
}

func TestParseTokenRefusesNonTokens(t *testing.T) {
	for _, s := range []string{"", "0", "-1", "+1", "01", " 1", "1 ", "1e3", "0x10", "9223372036854775808",
		"99999999999999999999", "1.0", "١"} {
		_, err := fencing.ParseToken(s)
		require.ErrorIs(t, err, authority.ErrInvalidArgument, "%q", s)
	}
}

func TestStaleTokenErrorMatchesSentinel(t *testing.T) {
	err := fmt.Errorf("write: %w", &fencing.StaleTokenError{Object: "actor/a", Token: 3})
	require.ErrorIs(t, err, fencing.ErrStaleToken)
	require.NotErrorIs(t, err, authority.ErrInvalidArgument)
	require.Equal(t, `write: fencing: stale ownership token: object "actor/a" token 3`, err.Error())
	require.False(t, errors.Is(errors.New("other"), fencing.ErrStaleToken))
}

// TestTokenOfIsTheRowsOwnershipToken: TokenOf reads a store row's token — a
// valid one, raised by a rebind to a new lease — and a nil row has none.
func TestTokenOfIsTheRowsOwnershipToken(t *testing.T) {
	require.False(t, fencing.TokenOf(nil).Valid())
	fx := conformance.NewFixture(t, memoryHarness())
	ready := fx.Active(authority.ObjectUserSpot, "token-of", conformance.TargetA)
	tok := fencing.TokenOf(ready)
	require.True(t, tok.Valid())
	require.EqualValues(t, ready.OwnershipToken, tok)
	next := conformance.Target(conformance.NodeA, conformance.NodeLifecycle, authority.OwnerToken{OwnerID: conformance.OwnerA.OwnerID, LeaseGeneration: 2})
	fx.SetLive(next, true)
	key := fx.Key(authority.ObjectUserSpot, "token-of")
	res, err := fx.Store().CompareExchangeAuthority(fx.Ctx(), key, ready.StoreVersion, authority.RebindOwnerLease(conformance.OwnerA, next.Owner, nil))
	require.NoError(t, err)
	require.Greater(t, fencing.TokenOf(res.Snapshot), tok)
}

// memoryHarness is a conformance harness over a fresh memory store.
func memoryHarness() *conformance.Harness {
	live := memory.NewLiveSet()
	return &conformance.Harness{
		Store: memory.New(memory.Config{Liveness: live}),
		SetLive: func(_ testing.TB, node authority.NodeDescriptor, gen int64, owner authority.OwnerToken, on bool) {
			live.Set(node, gen, owner, on)
		},
		Now: time.Now,
	}
}
