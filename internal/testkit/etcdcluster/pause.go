package etcdcluster

import (
	"bytes"
	"fmt"
	"os"
	"syscall"
	"time"
)

// Pause stops member i's process with SIGSTOP: it keeps its sockets and
// state but answers nothing (no heartbeats, no client replies) until
// Resume — a slow or frozen member, not a crashed one. A paused leader is
// replaced by the others after the election timeout; its own clock moves
// on, so on Resume it sees the time that passed at once.
// Pause returns once the kernel reports the process stopped: a signal is
// delivered asynchronously, and a request sent right after Pause must not
// be answered.
func (c *Cluster) Pause(i int) error {
	if err := c.signal(i, syscall.SIGSTOP, "pause"); err != nil {
		return err
	}
	m := c.member(i)
	m.mu.Lock()
	pid := 0
	if m.proc != nil {
		pid = m.proc.cmd.Process.Pid
	}
	m.mu.Unlock()
	return waitStopped(pid, 5*time.Second)
}

// waitStopped waits until /proc says process pid is stopped (state T).
func waitStopped(pid int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return fmt.Errorf("pause member process %d: %w", pid, err)
		}
		// the state follows the command name in parentheses, which may hold spaces
		if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) && (stat[i+2] == 'T' || stat[i+2] == 't') {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pause member process %d: not stopped after %v", pid, timeout)
		}
		time.Sleep(time.Millisecond)
	}
}

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
