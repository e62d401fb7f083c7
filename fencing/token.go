package fencing

import (
	"strconv"

	authority "github.com/zlink-systems/authority"
)

// Token is an ownership token: a number the owner of an object carries on
// every external effect it makes for that object, so that the resource
// receiving the effect can refuse one from an owner that has since been
// replaced.
//
// The contract expected of the token's source (the authority store, per
// object key):
//   - a token is positive (> 0);
//   - every change of the object's owner, or of its owner lease generation
//     (reserve, a move to a new owner, a rebind to a new lease, removal and
//     re-creation of the key), yields a token strictly greater than every
//     token handed out for that key before;
//   - a token is never handed to two different ownerships of one key, so an
//     owner keeps the same token for as long as it owns the object, and an
//     equal token is the same owner (accepted again).
//
// Tokens are compared only per object key: tokens of different keys are
// unrelated. A guard (Verifier, Guard) accepts a token that is at least the
// highest it has seen for the key, records it, and refuses a lower one.
type Token int64

// TokenOf returns the ownership token of a row read from (or granted by) the
// authority store, its Snapshot.OwnershipToken: the token the row's owner
// fences its effects with. A nil snapshot has none (0, not Valid).
func TokenOf(s *authority.Snapshot) Token {
	if s == nil {
		return 0
	}
	return Token(s.OwnershipToken)
}

// Valid reports whether t can be an ownership token (t > 0).
func (t Token) Valid() bool { return t > 0 }

// String returns t in decimal: the form it takes in an HTTP header
// (HeaderToken) or object metadata.
func (t Token) String() string { return strconv.FormatInt(int64(t), 10) }

// HeaderToken is the HTTP header an owner sends its token in when a service
// enforces tokens for it (value: Token.String).
const HeaderToken = "Fencing-Token"

// ParseToken parses the decimal form of a token (Token.String). Anything but
// a decimal integer in 1..2^63-1 is refused with an error wrapping
// authority.ErrInvalidArgument.
func ParseToken(s string) (Token, error) {
	if s == "" || len(s) > 19 || s[0] < '1' || s[0] > '9' {
		return 0, authority.Invalid("fencing: token must be a decimal integer in 1..9223372036854775807.")
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		return 0, authority.Invalid("fencing: token must be a decimal integer in 1..9223372036854775807.")
	}
	return Token(n), nil
}
