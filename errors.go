package authority

import (
	"errors"
	"strings"
)

// Sentinel errors. Provider errors wrap one of these, so callers test them with
// errors.Is whatever the provider.
var (
	// ErrInvalidArgument reports input the contract rejects. Nothing was written.
	ErrInvalidArgument = errors.New("authority: invalid argument")
	// ErrUnavailable reports that the backing store could not be reached or
	// refused the request before applying it. The request was not applied;
	// retrying is safe.
	ErrUnavailable = errors.New("authority: store unavailable")
	// ErrOutcomeUnknown reports a write that was sent but whose result was not
	// received (for example a timeout after send). It may or may not have been
	// applied. The idempotent operations (commit, abort, completeCreation,
	// commitAggregate, abortAggregate) can be retried and then report
	// alreadyCommitted / alreadyAborted / alreadyCompleted when the first
	// attempt was applied.
	ErrOutcomeUnknown = errors.New("authority: write outcome unknown")
	// ErrLimitExceeded reports a request that cannot fit the store's
	// configured limits (request size, operations per transaction). Nothing
	// was written; the error names the setting to raise.
	ErrLimitExceeded = errors.New("authority: store limit exceeded")
	// ErrAccessDenied reports rejected credentials or missing permissions.
	ErrAccessDenied = errors.New("authority: access denied")
	// ErrUnsupportedServer reports a backing server too old or lacking a
	// feature the provider relies on.
	ErrUnsupportedServer = errors.New("authority: unsupported server")
	// ErrCorrupt reports stored data the provider cannot decode.
	ErrCorrupt = errors.New("authority: stored data is corrupt")
	// ErrClosed reports use of a store after Close.
	ErrClosed = errors.New("authority: store closed")
)

// Error is an error with a human-readable message that wraps one of the
// sentinels above (and optionally a cause).
type Error struct {
	// Sentinel is the exported sentinel this error matches with errors.Is.
	Sentinel error
	// Message is the human-readable message.
	Message string
	// Cause is the underlying error, if any.
	Cause error
}

// Error returns the message, followed by the cause when there is one
// (after ": ", or after a space when the message is a sentence ending in a
// full stop, as the contract's validation messages are).
func (e *Error) Error() string {
	switch {
	case e.Cause == nil:
		return e.Message
	case strings.HasSuffix(e.Message, "."):
		return e.Message + " " + e.Cause.Error()
	}
	return e.Message + ": " + e.Cause.Error()
}

// Unwrap returns the sentinel and the cause.
func (e *Error) Unwrap() []error {
	if e.Cause != nil {
		return []error{e.Sentinel, e.Cause}
	}
	return []error{e.Sentinel}
}

// Invalid returns an error wrapping ErrInvalidArgument with the given message.
func Invalid(message string) error {
	return &Error{Sentinel: ErrInvalidArgument, Message: message}
}

// Wrap returns an error wrapping sentinel with a message and a cause.
func Wrap(sentinel error, message string, cause error) error {
	return &Error{Sentinel: sentinel, Message: message, Cause: cause}
}
