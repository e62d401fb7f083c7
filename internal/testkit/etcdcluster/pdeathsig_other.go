//go:build !linux

package etcdcluster

import "syscall"

// memberSysProcAttr has no parent-death signal outside Linux; a member still
// exits when its standard input (held by the parent) closes.
func memberSysProcAttr() *syscall.SysProcAttr { return nil }
