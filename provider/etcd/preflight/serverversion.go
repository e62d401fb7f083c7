package preflight

import (
	"fmt"
	"strings"
)

// MinServerVersion is the oldest etcd server the provider accepts: etcd.New
// refuses older ones (an error wrapping authority.ErrUnsupportedServer), and
// authorityctl doctor reports one. Verified: the whole etcd test suite and
// the coordinator's scenarios pass against the servers of .ci/etcd-versions
// (Debian's 3.4.23, 3.5.36, and 3.6.17 as a 3-member TLS + authentication
// cluster) and an embedded 3.7.3 (every test run). 3.4 and 3.5 releases
// before RecommendedServer34 / RecommendedServer35 are accepted with a
// warning (ServerVersionWarning, etcd's Store.ServerWarning): they have known watch
// and lease bugs.
const MinServerVersion = "3.4.0"

// Patch releases below which a server line has known watch and lease bugs
// the provider depends on not hitting: watches that go back in time after a
// partition (etcd-io/etcd#15271), lose events under stream starvation
// (#17529) or around compaction (#18089, #19179), progress notifications
// (#15220), and a stalled old leader revoking leases (#15247). Kubernetes
// requires the same releases before it trusts its watch cache.
const (
	// RecommendedServer34 is the first 3.4 release with those fixes.
	RecommendedServer34 = "3.4.31"
	// RecommendedServer35 is the first 3.5 release with those fixes.
	RecommendedServer35 = "3.5.13"
)

// ServerVersionWarning returns a sentence warning about the etcd server
// version (as Status reports it) when it is accepted (at least
// MinServerVersion) but older than the fixed release of its line
// (RecommendedServer34, RecommendedServer35), and "" otherwise. The provider
// works on such a server (CI runs its suite on one), but the bugs above can
// hit it under partitions, overload or compaction: upgrade to the latest patch
// release of the line.
func ServerVersionWarning(version string) string {
	v := strings.TrimPrefix(strings.TrimSpace(version), "v")
	var fixed string
	switch {
	case strings.HasPrefix(v, "3.4."):
		fixed = RecommendedServer34
	case strings.HasPrefix(v, "3.5."):
		fixed = RecommendedServer35
	default:
		return ""
	}
	if !ServerVersionAtLeast(v, MinServerVersion) || ServerVersionAtLeast(v, fixed) {
		return ""
	}
	return fmt.Sprintf("etcd %s has known watch and lease bugs fixed in %s (etcd-io/etcd#15271, #17529, #18089, #15247); upgrade to the latest %s release",
		v, fixed, v[:3])
}

// ServerVersionAtLeast reports whether the dotted version v ("3.4.23",
// "v3.5.0-rc.1"; missing parts count as 0) is at least min. A pre-release
// counts as its release. etcd.New refuses a server below MinServerVersion
// with it, and authorityctl doctor reports one.
func ServerVersionAtLeast(v, min string) bool {
	parse := func(s string) [3]int {
		var out [3]int
		s = strings.TrimPrefix(strings.TrimSpace(s), "v")
		for i, part := range strings.SplitN(strings.SplitN(s, "-", 2)[0], ".", 3) {
			n := 0
			for _, c := range part {
				if c < '0' || c > '9' {
					break
				}
				n = n*10 + int(c-'0')
			}
			out[i] = n
		}
		return out
	}
	a, b := parse(v), parse(min)
	for i := range a {
		if a[i] != b[i] {
			return a[i] > b[i]
		}
	}
	return true
}
