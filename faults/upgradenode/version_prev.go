//go:build prevrelease

package main

import etcdstore "github.com/zlink-systems/authority/provider/etcd"

// build names this build in the reports.
var build = "previous-release"

// activeVersion is 0: the previous release knows no store versions.
func activeVersion(*etcdstore.Store) int { return 0 }
