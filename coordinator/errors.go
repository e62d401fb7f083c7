package coordinator

import (
	"context"
	"errors"
	"strings"
)

// ErrorKind names the framework error kind of a coordinator failure. An
// ErrorKind is itself an error, so
// errors.Is(err, KindSpotMoving) tests the kind of any *Error in err's chain.
type ErrorKind string

// Error kinds.
const (
	// KindRequestFailed: a store, placement or transport operation failed, or
	// the request cannot be served as asked.
	KindRequestFailed ErrorKind = "RequestFailed"
	// KindPlacementCapacityExhausted: no eligible placement target has room.
	KindPlacementCapacityExhausted ErrorKind = "PlacementCapacityExhausted"
	// KindSpotIDConflict: a generated Spot ID is already in use.
	KindSpotIDConflict ErrorKind = "SpotIdConflict"
	// KindSpotTypeMismatch: the Spot exists with another stable type.
	KindSpotTypeMismatch ErrorKind = "SpotTypeMismatch"
	// KindSpotMoving: the Spot's authority changed under the operation.
	KindSpotMoving ErrorKind = "SpotMoving"
	// KindSpotGenerationStale: the caller's Spot generation or route is stale.
	KindSpotGenerationStale ErrorKind = "SpotGenerationStale"
	// KindDeadlineExceeded: the operation's end-to-end deadline passed.
	KindDeadlineExceeded ErrorKind = "DeadlineExceeded"
	// KindInvalidOperation: the coordinator is not configured or not in a
	// state to serve the operation (no owner lease, no relocation store, no
	// transport, a reservation it does not hold).
	KindInvalidOperation ErrorKind = "InvalidOperation"
	// KindIntegrity: stored creation content or a relocation receipt failed
	// its integrity checks.
	KindIntegrity ErrorKind = "Integrity"
)

// Error returns the kind's name, so a kind can be used as an errors.Is target.
func (k ErrorKind) Error() string { return string(k) }

// Error is a coordinator failure of one kind.
type Error struct {
	// Kind is the framework error kind.
	Kind ErrorKind
	// Message is the human-readable message.
	Message string
	// Retryable reports whether the whole operation may be retried as is.
	Retryable bool
	// Cause is the underlying error, if any.
	Cause error
}

// Error returns the kind, the message and the cause.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(string(e.Kind))
	b.WriteString(": ")
	b.WriteString(e.Message)
	if e.Cause != nil {
		b.WriteString(": ")
		b.WriteString(e.Cause.Error())
	}
	return b.String()
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Cause }

// Is reports whether target is e's kind.
func (e *Error) Is(target error) bool {
	k, ok := target.(ErrorKind)
	return ok && k == e.Kind
}

// IsRetryable reports whether err is, or wraps, a retryable *Error.
func IsRetryable(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Retryable
}

// RollbackError is a creation failure whose rollback (abort of the
// reservation and discard of the materialized object) also failed. Unwrap
// yields the creation failure first, then every cleanup failure, so errors.As
// finds the creation failure's *Error.
type RollbackError struct {
	// Err is the failure that triggered the rollback.
	Err error
	// Cleanup are the rollback failures.
	Cleanup []error
}

// Error describes the failure and its rollback failures.
func (e *RollbackError) Error() string {
	var b strings.Builder
	b.WriteString("Remote User Spot creation rollback failed: ")
	b.WriteString(e.Err.Error())
	for _, c := range e.Cleanup {
		b.WriteString("; cleanup: ")
		b.WriteString(c.Error())
	}
	return b.String()
}

// Unwrap returns the failure and the cleanup failures.
func (e *RollbackError) Unwrap() []error { return append([]error{e.Err}, e.Cleanup...) }

func newError(kind ErrorKind, message string, retryable bool, cause error) *Error {
	return &Error{Kind: kind, Message: message, Retryable: retryable, Cause: cause}
}

// failure converts err from an operation running under ctx: an *Error passes
// through; a passed deadline becomes KindDeadlineExceeded (retryable) naming
// the operation message describes; a cancelled context passes through;
// anything else becomes kind with message.
func failure(ctx context.Context, kind ErrorKind, message string, err error) error {
	var e *Error
	if errors.As(err, &e) {
		return err
	}
	if errors.Is(err, context.DeadlineExceeded) || ctx.Err() == context.DeadlineExceeded {
		return newError(KindDeadlineExceeded, deadlineMessage(message), true, err)
	}
	if errors.Is(err, context.Canceled) {
		return err
	}
	return newError(kind, message, false, err)
}

// deadlineMessage turns a failure message ("Instance authority read
// failed.") into the message of the same operation running out of time
// ("Instance authority read exceeded its deadline.").
func deadlineMessage(message string) string {
	op, ok := strings.CutSuffix(message, " failed.")
	if !ok {
		op = strings.TrimSuffix(message, ".")
	}
	return op + " exceeded its deadline."
}

// Operations named by the deadline errors of a whole call.
const (
	opUserSpotCreation   = "User Spot creation"
	opInstanceActivation = "Instance activation"
)

// asDeadline turns a bare context deadline error into KindDeadlineExceeded
// naming op ("User Spot creation exceeded its end-to-end deadline.") and
// leaves everything else alone.
func asDeadline(err error, op string) error {
	if err == nil {
		return nil
	}
	var e *Error
	var r *RollbackError
	if errors.As(err, &r) {
		if !errors.As(r.Err, &e) && errors.Is(r.Err, context.DeadlineExceeded) {
			// callers sharing one admission share r: change a copy
			cp := *r
			cp.Err = endToEndDeadline(op, r.Err)
			return &cp
		}
		return r
	}
	if !errors.As(err, &e) && errors.Is(err, context.DeadlineExceeded) {
		return endToEndDeadline(op, err)
	}
	return err
}

func endToEndDeadline(op string, cause error) error {
	return newError(KindDeadlineExceeded, op+" exceeded its end-to-end deadline.", true, cause)
}
