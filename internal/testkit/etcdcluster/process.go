package etcdcluster

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// process is one running member process as seen by the parent.
type process struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	started chan struct{} // closed when the member has bound its ports
	ready   chan struct{} // closed when the member has joined and serves
	exited  chan struct{} // closed after the process was reaped
	err     error         // wait result, valid after exited
}

// startProcess re-executes the test binary as the member mc, appending its
// standard error to logPath. It returns once the member has started, exited,
// or timeout passed.
func startProcess(mc memberConfig, logPath string, timeout time.Duration) (*process, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find test binary: %w", err)
	}
	raw, err := json.Marshal(mc)
	if err != nil {
		return nil, err
	}
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logFile.Close() // the child holds its own descriptor

	// -test.run=^$ keeps a binary whose TestMain forgot RunMemberIfRequested
	// from running its tests again.
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), envMember+"="+string(raw))
	cmd.Stderr = logFile
	cmd.SysProcAttr = memberSysProcAttr()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start member %s: %w", mc.Name, err)
	}
	p := &process{
		cmd:     cmd,
		stdin:   stdin,
		started: make(chan struct{}),
		ready:   make(chan struct{}),
		exited:  make(chan struct{}),
	}
	go p.watch(stdout)

	select {
	case <-p.started:
		return p, nil
	case <-p.exited:
		return nil, fmt.Errorf("member %s exited during start-up (%v); did TestMain call etcdcluster.RunMemberIfRequested? see %s", mc.Name, p.err, logPath)
	case <-time.After(timeout):
		p.kill()
		return nil, fmt.Errorf("member %s did not start within %v; see %s", mc.Name, timeout, logPath)
	}
}

// watch reads the member's status lines, then reaps it.
func (p *process) watch(stdout io.Reader) {
	sc := bufio.NewScanner(stdout)
	startedClosed, readyClosed := false, false
	for sc.Scan() {
		switch sc.Text() {
		case lineStarted:
			if !startedClosed {
				close(p.started)
				startedClosed = true
			}
		case lineReady:
			if !readyClosed {
				close(p.ready)
				readyClosed = true
			}
		}
	}
	_, _ = io.Copy(io.Discard, stdout)
	p.err = p.cmd.Wait()
	close(p.exited)
}

// isReady reports whether the member said it serves.
func (p *process) isReady() bool {
	select {
	case <-p.ready:
		return true
	default:
		return false
	}
}

// kill sends SIGKILL and waits until the process is reaped.
func (p *process) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

// terminate sends SIGTERM, waits up to grace for a clean exit, then kills.
// It returns the process's exit error (nil for a clean stop).
func (p *process) terminate(grace time.Duration) error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	_ = p.cmd.Process.Signal(syscall.SIGCONT) // a paused member acts on it
	select {
	case <-p.exited:
		return p.err
	case <-time.After(grace):
		p.kill()
		return errors.New("member did not stop in time and was killed")
	}
}
