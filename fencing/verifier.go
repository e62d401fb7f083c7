package fencing

import "context"

// Verifier enforces ownership tokens at one resource.
//
// Verify accepts token for object when it is at least the highest token the
// verifier has accepted for object, records it as the highest, and returns
// nil; it refuses a lower one with an error matching ErrStaleToken, and bad
// input (empty object key, token <= 0) with one matching
// authority.ErrInvalidArgument.
//
// A Verifier is only a fence if the check is atomic with the effect it
// guards: a stale owner must not be able to pass Verify, lose the race to a
// newer owner, and then apply its effect. Guard.Verifier gets this by
// checking inside the effect's own SQL transaction (the fence row stays
// locked until commit); a service enforcing a token sent in an HTTP header
// checks it under the same lock or transaction that applies the request; an
// object store uses a conditional put. See the package documentation.
type Verifier interface {
	Verify(ctx context.Context, object string, token Token) error
}
