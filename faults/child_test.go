package faults_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
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

// runChildIfRequested runs the child run when the process was started as
// one (env holds its JSON configuration), and exits; otherwise it returns
// at once. The child ends when its standard input closes.
func runChildIfRequested[C any](env, name string, run func(C) error) {
	raw, ok := os.LookupEnv(env)
	if !ok {
		return
	}
	var cfg C
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		fmt.Fprintf(os.Stderr, "%s: bad %s: %v\n", name, env, err)
		os.Exit(2)
	}
	exitOnStdinClose()
	if err := run(cfg); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
	os.Exit(0)
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

// lineChild is a child whose JSON lines decode into L: it is started once it
// wrote its ready line, and its other lines are collected.
type lineChild[L any] struct {
	*childProc
	ready L
	mu    sync.Mutex
	lines []L
	more  chan struct{} // signalled on each line collected
}

// startLineChild starts a child (startChild) and waits for the line isReady
// accepts.
func startLineChild[L any](t *testing.T, env string, cfg any, isReady func(L) bool) *lineChild[L] {
	t.Helper()
	p := &lineChild[L]{more: make(chan struct{}, 1)}
	readyCh := make(chan L, 1)
	p.childProc = startChild(t, env, cfg, func(raw []byte) {
		var l L
		if json.Unmarshal(raw, &l) != nil {
			return
		}
		if isReady(l) {
			readyCh <- l
			return
		}
		p.mu.Lock()
		p.lines = append(p.lines, l)
		p.mu.Unlock()
		select {
		case p.more <- struct{}{}:
		default:
		}
	})
	select {
	case p.ready = <-readyCh:
		return p
	case <-p.exited:
		t.Fatal("the child process exited before it was ready")
	case <-time.After(settleTimeout):
		t.Fatal("the child process was not ready in time")
	}
	return nil
}

// waitFor waits until done holds for the lines collected so far.
func (p *lineChild[L]) waitFor(t *testing.T, what string, done func([]L) bool) {
	t.Helper()
	deadline := time.After(settleTimeout)
	for {
		p.mu.Lock()
		ok := done(p.lines)
		p.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-p.more:
		case <-p.exited:
			t.Fatalf("the child process exited before %s", what)
		case <-deadline:
			t.Fatalf("the child process did not report %s in time", what)
		}
	}
}

// collected returns a copy of the lines collected so far.
func (p *lineChild[L]) collected() []L {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]L(nil), p.lines...)
}
