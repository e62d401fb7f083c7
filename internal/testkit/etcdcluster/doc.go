// Package etcdcluster runs a multi-member etcd cluster on loopback for fault
// tests.
//
// Each member is a child process: the current test binary re-executed with an
// environment variable that makes it run one embedded etcd member
// (go.etcd.io/etcd/server/v3/embed) instead of its tests. Killing a member is
// therefore a real crash (SIGKILL), and a member restarts from its data
// directory under the test's temporary directory.
//
// Clients reach each member through a loopback TCP proxy that can pass
// traffic, blackhole it (accept and hold connections, forward nothing), hold
// only the replies (requests still reach the member; the answers are lost to
// the client until healed), or drop it (close every connection and refuse new
// ones). Peer traffic between members is not proxied.
//
// A test package that uses Start must call RunMemberIfRequested first thing in
// its TestMain:
//
//	func TestMain(m *testing.M) {
//		etcdcluster.RunMemberIfRequested()
//		goleak.VerifyTestMain(m)
//	}
package etcdcluster
