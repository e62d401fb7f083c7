package fencing

import (
	"errors"
	"fmt"
)

// ErrStaleToken reports an effect refused because it carries an ownership
// token lower than the highest one the guard has seen for the object: its
// owner has been replaced. Match it with errors.Is; the error is a
// *StaleTokenError.
var ErrStaleToken = errors.New("fencing: stale ownership token")

// StaleTokenError is the refusal of a stale token. It matches ErrStaleToken.
type StaleTokenError struct {
	// Object is the object key the token was presented for.
	Object string
	// Token is the refused token.
	Token Token
	// Highest is the highest token the guard has recorded for Object, when
	// the guard knows it (0 otherwise).
	Highest Token
}

// Error describes the refusal.
func (e *StaleTokenError) Error() string {
	if e.Highest > 0 {
		return fmt.Sprintf("%v: object %q token %d is below the recorded %d", ErrStaleToken, e.Object, e.Token, e.Highest)
	}
	return fmt.Sprintf("%v: object %q token %d", ErrStaleToken, e.Object, e.Token)
}

// Is reports whether target is ErrStaleToken.
func (e *StaleTokenError) Is(target error) bool { return target == ErrStaleToken }

// ErrOtherCluster reports an effect refused because its token is of another
// cluster than the one the fence table follows (Guard.ForCluster), or names
// no cluster while the table follows one. Match it with errors.Is; the error
// is an *OtherClusterError.
var ErrOtherCluster = errors.New("fencing: token of another cluster")

// OtherClusterError is the refusal of a token of another cluster. It
// matches ErrOtherCluster.
type OtherClusterError struct {
	// Object is the object key the token was presented for.
	Object string
	// Cluster is the cluster of the guard that presented it ("": none).
	Cluster string
	// Following is the cluster the fence table follows.
	Following string
}

// Error describes the refusal and what to do when the cluster was replaced.
func (e *OtherClusterError) Error() string {
	of := fmt.Sprintf("cluster %q", e.Cluster)
	if e.Cluster == "" {
		of = "a guard bound to no cluster (Guard.ForCluster)"
	}
	return fmt.Sprintf("%v: object %q: the fence table follows cluster %q, the token is of %s; "+
		"a writer of a replaced cluster stays refused; if cluster %q really was replaced, adopt the new one (Guard.Adopt, docs/operations.md)",
		ErrOtherCluster, e.Object, e.Following, of, e.Following)
}

// Is reports whether target is ErrOtherCluster.
func (e *OtherClusterError) Is(target error) bool { return target == ErrOtherCluster }

// ErrRetry reports a Check that lost a conflict with a concurrent
// transaction: a serialization failure (SQLSTATE 40001; under REPEATABLE
// READ or SERIALIZABLE, the fence changed after the transaction's snapshot
// was taken, by another Check of the object or by Adopt) or a deadlock
// (40P01). The transaction is rolled back; run it again from its start,
// Check first: the retry sees the change and is judged on it. The error
// also wraps the driver's own error.
var ErrRetry = errors.New("fencing: conflict with a concurrent transaction, retry the transaction")
