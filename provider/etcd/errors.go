package etcd

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strconv"
	"strings"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/internal/etcdpage"
	"github.com/zlink-systems/authority/provider/etcd/internal/revguard"
	"github.com/zlink-systems/authority/provider/etcd/internal/txnkit"
	"github.com/zlink-systems/authority/provider/etcd/preflight"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ErrClusterRegressed reports that the etcd cluster behind the store went
// back in time or is another cluster: a response carried a revision lower
// than one the store had already seen before sending the request, or a
// cluster ID other than the one of its first response. Both happen when the
// cluster is restored from a snapshot without `etcdutl snapshot restore
// --bump-revision … --mark-compacted` (revisions go back, so a StoreVersion
// read before the restore can name another row state afterwards), or with a
// new --initial-cluster-token (a new cluster ID; see the README's "Backup and
// restore"), or when the endpoints now reach a different cluster.
//
// From then on the store refuses every request (errors wrapping both
// ErrClusterRegressed and authority.ErrUnavailable, nothing sent) and ends
// the keep-alive of every owner lease it granted (Done closes), until the
// caller closes it and opens a new store. The request whose response showed
// the regression is answered with ErrClusterRegressed too: wrapping
// authority.ErrOutcomeUnknown when it was a write (it may have been applied
// in the restored cluster), authority.ErrUnavailable when it was a read.
var ErrClusterRegressed = revguard.ErrClusterRegressed

func corrupt(key string, cause error) error {
	return authority.Wrap(authority.ErrCorrupt, fmt.Sprintf("etcd key %q holds undecodable data", key), cause)
}

// mapError turns a client error into a typed error. write says the request
// could have changed something, so that a timeout after send is reported as
// ErrOutcomeUnknown rather than ErrUnavailable.
func mapError(err error, write bool) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, ErrClusterRegressed) || errors.Is(err, ErrReadOnly) { // already classified (internal/revguard, readOnlyKV)
		return err
	}
	if typed, ok := revguard.Typed(err); ok {
		return typed // typed by the regression guard
	}
	unknownOr := func(msg string) error {
		if write {
			return authority.Wrap(authority.ErrOutcomeUnknown, "etcd write "+msg, err)
		}
		return authority.Wrap(authority.ErrUnavailable, "etcd read "+msg, err)
	}
	switch {
	case errors.Is(err, ErrClusterRegressed):
		return err // typed by the regression guard
	case errors.Is(err, rpctypes.ErrTooManyOps):
		return txnkit.LimitError(txnkit.FlagMaxTxnOps, "the transaction", err)
	case errors.Is(err, rpctypes.ErrRequestTooLarge):
		return txnkit.LimitError(txnkit.FlagMaxRequestBytes, "the request", err)
	case errors.Is(err, rpctypes.ErrPermissionDenied):
		return authority.Wrap(authority.ErrAccessDenied, "etcd denied the permission: the user's role does not cover the key", err)
	case errors.Is(err, rpctypes.ErrAuthFailed),
		errors.Is(err, rpctypes.ErrInvalidAuthToken), errors.Is(err, rpctypes.ErrUserEmpty),
		errors.Is(err, rpctypes.ErrAuthOldRevision), errors.Is(err, rpctypes.ErrUserNotFound):
		return authority.Wrap(authority.ErrAccessDenied, "etcd refused the credentials", err)
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		// refused before anything was applied
		return authority.Wrap(authority.ErrUnavailable, "etcd no longer knows a lease of the request", err)
	case errors.Is(err, rpctypes.ErrStopped):
		// a leader stopping gracefully may have replicated the write
		return unknownOr("was cut short by a stopping member")
	case errors.Is(err, rpctypes.ErrNoLeader), errors.Is(err, rpctypes.ErrNotCapable),
		errors.Is(err, rpctypes.ErrUnhealthy),
		errors.Is(err, rpctypes.ErrTooManyRequests),
		errors.Is(err, rpctypes.ErrNotLeader):
		return authority.Wrap(authority.ErrUnavailable, "etcd is unavailable", err)
	case errors.Is(err, rpctypes.ErrNoSpace):
		// etcd applies the write that crosses --quota-backend-bytes and
		// only then answers NOSPACE (and raises the alarm), with the code
		// it gives a write it refused before proposing: not "not applied"
		return unknownOr("ran out of the server's space quota (NOSPACE alarm: compact, defragment, disarm, or raise --quota-backend-bytes)")
	case errors.Is(err, rpctypes.ErrTimeout), errors.Is(err, rpctypes.ErrTimeoutDueToLeaderFail),
		errors.Is(err, rpctypes.ErrTimeoutDueToConnectionLost), errors.Is(err, rpctypes.ErrLeaderChanged),
		errors.Is(err, rpctypes.ErrTimeoutWaitAppliedIndex):
		return unknownOr("timed out on the server")
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return unknownOr("did not complete")
	}
	if etcdpage.TooLarge(err) {
		// the reply, not the request: nothing on the server limits it
		return authority.Wrap(authority.ErrLimitExceeded,
			"the response exceeds the client's receive limit (MaxCallRecvMsgSize: 64 MiB on the client the store dials, else that of Config.Client)", err)
	}
	if st, ok := status.FromError(err); ok {
		switch st.Code() {
		case codes.ResourceExhausted:
			return txnkit.LimitError(txnkit.FlagMaxRequestBytes, "the request (or the client's MaxCallSendMsgSize)", err)
		case codes.Unavailable:
			// gRPC also answers Unavailable when the connection broke after
			// the request was sent ("error reading from server: EOF"); only
			// a failure to connect proves a write was never applied.
			if write && !strings.Contains(st.Message(), "Error while dialing") {
				return unknownOr("lost its connection")
			}
			return authority.Wrap(authority.ErrUnavailable, "etcd is unavailable", err)
		case codes.PermissionDenied, codes.Unauthenticated:
			return authority.Wrap(authority.ErrAccessDenied, "etcd refused the credentials", err)
		case codes.DeadlineExceeded, codes.Canceled:
			return unknownOr("did not complete")
		case codes.Unknown:
			// etcd before 3.5 answers a request whose deadline (or
			// cancellation) reached the server with the context's own
			// text and code Unknown: the same event as DeadlineExceeded
			if msg := st.Message(); msg == context.DeadlineExceeded.Error() || msg == context.Canceled.Error() {
				return unknownOr("did not complete (the server saw the request's " + msg + ")")
			}
		}
	}
	if write { // nothing says it was not applied
		return unknownOr("failed")
	}
	return fmt.Errorf("etcd: %w", err)
}

// connectFailure explains why a client could not reach an etcd endpoint,
// which the client itself does not say (a request to an endpoint it cannot
// connect to only ends with its context): preflight.ProbeEndpoint's finding,
// or mapError(cause) when the probe finds nothing wrong.
func connectFailure(ctx context.Context, endpoint string, tlsCfg *tls.Config, cause error) error {
	if err := preflight.ProbeEndpoint(ctx, endpoint, tlsCfg); err != nil {
		return err
	}
	return mapError(cause, false)
}

// itoa is the decimal text of n (figures in messages: an owner generation,
// a revision, a count).
func itoa(n int64) string { return strconv.FormatInt(n, 10) }
