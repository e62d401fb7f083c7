//go:build prevrelease

package main

import etcdstore "github.com/zlink-systems/authority/provider/etcd"

// build names this build in the reports.
var build = "previous-release"

// activeVersion is the store version the store works at (the previous
// release, .ci/previous-release, knows store versions).
func activeVersion(s *etcdstore.Store) int { return int(s.ActiveVersion()) }
