package faults_test

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// childProc is a child process of the test binary: the binary re-executed
// with an environment variable holding its JSON configuration (TestMain
// dispatches on it, as etcdcluster runs its members). The child reports on
// its standard output, one JSON line each; its standard input closing ends
// it, and it dies with the test process.
type childProc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	exited chan struct{}
}

// startChild starts a child with env set to cfg's JSON and hands each line
// it writes to onLine (on one goroutine, in order) until it exits. t's
// cleanup kills it.
func startChild(t *testing.T, env string, cfg any, onLine func([]byte)) *childProc {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), env+"="+string(raw))
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &childProc{cmd: cmd, exited: make(chan struct{})}
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-p.exited
	})
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			onLine(sc.Bytes())
		}
		_, _ = io.Copy(io.Discard, stdout)
		_ = cmd.Wait()
		close(p.exited)
	}()
	return p
}

// exitOnStdinClose ends the child process when its parent closes its
// standard input (or dies).
func exitOnStdinClose() {
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()
}

// signal sends sig to the child.
func (p *childProc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v: %v", sig, err)
	}
}

// stop ends the child (its standard input closes) and waits for it.
func (p *childProc) stop(t *testing.T) {
	t.Helper()
	_ = p.stdin.Close()
	select {
	case <-p.exited:
	case <-time.After(settleTimeout):
		t.Fatal("the child process did not end")
	}
}
