package etcd

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	authority "github.com/zlink-systems/authority"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
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

// etcd 3.4 answers a request whose deadline reached the server with code
// Unknown and the context's text (a feed opened with a deadline of a few
// milliseconds got it on Debian's 3.4.23): it is typed as the deadline it is,
// ErrUnavailable for a read and ErrOutcomeUnknown for a write, never an
// untyped error.
func TestServerSideDeadlineOfAnOldServerIsTyped(t *testing.T) {
	for _, msg := range []string{"context deadline exceeded", "context canceled"} {
		err := status.Error(codes.Unknown, msg)
		r := mapError(err, false)
		require.ErrorIs(t, r, authority.ErrUnavailable)
		require.ErrorContains(t, r, "did not complete")
		require.ErrorIs(t, mapError(err, true), authority.ErrOutcomeUnknown)
	}
	// any other Unknown status stays what it was: not a deadline
	other := mapError(status.Error(codes.Unknown, "something else"), false)
	require.False(t, errors.Is(other, authority.ErrUnavailable))
}
