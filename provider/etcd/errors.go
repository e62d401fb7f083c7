package etcd

import (
	"context"
	"errors"
	"fmt"

	authority "github.com/zlink-systems/authority"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Flags named by ErrLimitExceeded errors.
const (
	flagMaxTxnOps       = "--max-txn-ops"
	flagMaxRequestBytes = "--max-request-bytes"
)

func corrupt(key string, cause error) error {
	return authority.Wrap(authority.ErrCorrupt, fmt.Sprintf("etcd key %q holds undecodable data", key), cause)
}

func limitError(flag, what string, cause error) error {
	return authority.Wrap(authority.ErrLimitExceeded,
		fmt.Sprintf("%s exceeds the etcd limit; raise the server's %s (and the store's matching Config limit)", what, flag), cause)
}

// mapError turns a client error into a typed error. write says the request
// could have changed something, so that a timeout after send is reported as
// ErrOutcomeUnknown rather than ErrUnavailable.
func mapError(err error, write bool) error {
	if err == nil {
		return nil
	}
	unknownOr := func(msg string) error {
		if write {
			return authority.Wrap(authority.ErrOutcomeUnknown, "etcd write "+msg, err)
		}
		return authority.Wrap(authority.ErrUnavailable, "etcd read "+msg, err)
	}
	switch {
	case errors.Is(err, rpctypes.ErrTooManyOps):
		return limitError(flagMaxTxnOps, "the transaction", err)
	case errors.Is(err, rpctypes.ErrRequestTooLarge):
		return limitError(flagMaxRequestBytes, "the request", err)
	case errors.Is(err, rpctypes.ErrPermissionDenied), errors.Is(err, rpctypes.ErrAuthFailed),
		errors.Is(err, rpctypes.ErrInvalidAuthToken), errors.Is(err, rpctypes.ErrUserEmpty),
		errors.Is(err, rpctypes.ErrAuthOldRevision), errors.Is(err, rpctypes.ErrUserNotFound):
		return authority.Wrap(authority.ErrAccessDenied, "etcd refused the credentials", err)
	case errors.Is(err, rpctypes.ErrNoLeader), errors.Is(err, rpctypes.ErrNotCapable),
		errors.Is(err, rpctypes.ErrStopped), errors.Is(err, rpctypes.ErrUnhealthy),
		errors.Is(err, rpctypes.ErrTooManyRequests), errors.Is(err, rpctypes.ErrNoSpace),
		errors.Is(err, rpctypes.ErrNotLeader):
		return authority.Wrap(authority.ErrUnavailable, "etcd is unavailable", err)
	case errors.Is(err, rpctypes.ErrTimeout), errors.Is(err, rpctypes.ErrTimeoutDueToLeaderFail),
		errors.Is(err, rpctypes.ErrTimeoutDueToConnectionLost), errors.Is(err, rpctypes.ErrLeaderChanged),
		errors.Is(err, rpctypes.ErrTimeoutWaitAppliedIndex):
		return unknownOr("timed out on the server")
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return unknownOr("did not complete")
	}
	if st, ok := status.FromError(err); ok {
		switch st.Code() {
		case codes.ResourceExhausted:
			return limitError(flagMaxRequestBytes, "the request (or the client's MaxCallSendMsgSize)", err)
		case codes.Unavailable:
			return authority.Wrap(authority.ErrUnavailable, "etcd is unavailable", err)
		case codes.PermissionDenied, codes.Unauthenticated:
			return authority.Wrap(authority.ErrAccessDenied, "etcd refused the credentials", err)
		case codes.DeadlineExceeded, codes.Canceled:
			return unknownOr("did not complete")
		}
	}
	return fmt.Errorf("etcd: %w", err)
}
