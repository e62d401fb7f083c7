//go:build !authority_next

package storeversion

// latest is Latest in a released build.
const latest = FewerKeys
