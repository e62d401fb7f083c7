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
