//go:build authority_next

package storeversion

// latest is Latest in a test build with the pretend next version.
const latest = NextPretend
