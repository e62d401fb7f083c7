// Package faults_test runs the authority store's etcd provider on a
// 3-member etcd cluster of child processes (internal/testkit/etcdcluster) and
// injects faults: member crashes, leader kills, blackholed and lost replies,
// expired owner leases, paused (SIGSTOP) leaders and owner processes,
// compaction and defragmentation under listings and watches. Each test
// asserts that nothing acknowledged is lost and prints one figure line
// (t.Log) readable from go test -v.
//
// The soak run (TestSoak) is skipped unless AUTHORITY_SOAK holds a duration.
package faults_test
