package etcdcluster

import "syscall"

// memberSysProcAttr makes the kernel SIGKILL a member when the thread that
// started it dies (on Linux, the parent's death; Go does not retire threads
// of goroutines that never locked one).
func memberSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
