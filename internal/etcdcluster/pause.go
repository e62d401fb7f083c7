package etcdcluster

import (
	"fmt"
	"syscall"
)

// Pause stops member i's process with SIGSTOP: it keeps its sockets and
// state but answers nothing (no heartbeats, no client replies) until
// Resume — a slow or frozen member, not a crashed one. A paused leader is
// replaced by the others after the election timeout; its own clock moves
// on, so on Resume it sees the time that passed at once.
func (c *Cluster) Pause(i int) error { return c.signal(i, syscall.SIGSTOP, "pause") }

// Resume continues member i's process after Pause (SIGCONT). Resuming a
// member that is not paused does nothing.
func (c *Cluster) Resume(i int) error { return c.signal(i, syscall.SIGCONT, "resume") }

func (c *Cluster) signal(i int, sig syscall.Signal, what string) error {
	m := c.member(i)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.proc == nil {
		return fmt.Errorf("%s member %d: %w", what, i, ErrNotRunning)
	}
	if err := m.proc.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("%s member %d: %w", what, i, err)
	}
	return nil
}
