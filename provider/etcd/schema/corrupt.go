package schema

import (
	"fmt"

	authority "github.com/zlink-systems/authority"
)

// corrupt is the error for a stored key or value that does not decode: it
// wraps authority.ErrCorrupt, as the provider's errors do.
func corrupt(key string, cause error) error {
	return authority.Wrap(authority.ErrCorrupt, fmt.Sprintf("etcd key %q holds undecodable data", key), cause)
}
