//go:build !prevrelease

package main

import (
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/storeversion"
)

// build names this build in the reports.
var build = "current-" + storeversion.Latest.String()

// activeVersion is the store version the store works at.
func activeVersion(s *etcdstore.Store) int { return int(s.ActiveVersion()) }
