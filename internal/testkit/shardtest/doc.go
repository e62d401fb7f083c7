// Package shardtest is the set-up the tests of sharded stores share: N
// embedded etcd clusters started in TestMain (Main), a fresh namespace on
// each per test (Namespaces), a sharded store over them (Open), a
// conformance harness over it (Harness, SetLive), a compaction of every
// cluster (Compact) and a concurrency-safe set of identity claims (Claims).
//
// Only tests import it.
package shardtest
