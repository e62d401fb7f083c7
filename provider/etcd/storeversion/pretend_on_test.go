//go:build authority_next

package storeversion

// pretendBuild reports whether this test build has the tag authority_next.
const pretendBuild = true
