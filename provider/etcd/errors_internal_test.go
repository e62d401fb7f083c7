package etcd

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	authority "github.com/zlink-systems/authority"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// etcd applies the write that crosses the space quota before it answers
// NOSPACE, so a write that gets it may have applied: its outcome is unknown,
// never "not applied" (a caller would then drop what the write references).
func TestNoSpaceOnAWriteIsOutcomeUnknown(t *testing.T) {
	for _, err := range []error{rpctypes.ErrNoSpace, rpctypes.Error(rpctypes.ErrGRPCNoSpace)} { // as the client converts it
		w := mapError(err, true)
		require.ErrorIs(t, w, authority.ErrOutcomeUnknown)
		require.False(t, errors.Is(w, authority.ErrUnavailable))
		require.ErrorContains(t, w, "quota-backend-bytes")
		require.ErrorIs(t, mapError(err, false), authority.ErrUnavailable)
	}
}
