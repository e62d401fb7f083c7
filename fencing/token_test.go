package fencing_test

import (
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/require"
	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/fencing"
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
