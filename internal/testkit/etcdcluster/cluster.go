package etcdcluster

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Timeouts of the cluster's own bookkeeping.
const (
	startTimeout   = 30 * time.Second // a member process binds its ports
	readyTimeout   = 30 * time.Second // Start: every member serves
	stopGrace      = 10 * time.Second // Stop: SIGTERM before SIGKILL
	statusTimeout  = time.Second      // one Status or health read
	pollInterval   = 50 * time.Millisecond
	logTailOnError = 30 // lines of each member's log shown when a test failed
)

// ErrNotRunning is returned when an operation needs a running member and the
// member was killed or stopped.
var ErrNotRunning = errors.New("etcdcluster: member is not running")

// ErrRunning is returned by Restart for a member that is still running.
var ErrRunning = errors.New("etcdcluster: member is running")

// Options configures Start. The zero value is a 3-member cluster without
// fsync, heartbeat 50 ms and election timeout 500 ms.
type Options struct {
	// Members is the cluster size (default 3).
	Members int
	// Fsync turns fsync on. Off (the default) uses etcd's UnsafeNoFsync: a
	// SIGKILL loses nothing then (the page cache survives), a machine crash
	// would.
	Fsync bool
	// HeartbeatMs and ElectionMs are the raft timing (defaults 50 and 500).
	// The minimum lease TTL is about 1.5 × ElectionMs.
	HeartbeatMs, ElectionMs uint
	// SnapshotCount is etcd's --snapshot-count (0: etcd's default).
	SnapshotCount uint64
	// MaxTxnOps and MaxRequestBytes are etcd's limits (0: etcd's defaults).
	MaxTxnOps, MaxRequestBytes uint
}

// Cluster is a running multi-member etcd cluster of child processes, each
// behind its own proxy. Its methods are safe for concurrent use.
type Cluster struct {
	t       testing.TB
	opts    Options
	token   string
	members []*member
}

// member is one member's fixed identity and its current process.
type member struct {
	index     int
	name      string
	dataDir   string
	logPath   string
	peerURL   string
	clientURL string // direct, bypassing the proxy
	proxy     *proxy
	direct    *clientv3.Client // pinned to clientURL, for Status and health

	mu      sync.Mutex // guards proc and started
	proc    *process   // nil when killed or stopped
	started bool       // ever started: restarts use cluster state "existing"
}

// Start starts a cluster for t and waits until every member serves. Cleanup
// (registered with t.Cleanup) kills every member process and closes the
// proxies. The data directories live under t.TempDir().
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	if opts.Members <= 0 {
		opts.Members = 3
	}
	if opts.HeartbeatMs == 0 {
		opts.HeartbeatMs = 50
	}
	if opts.ElectionMs == 0 {
		opts.ElectionMs = 500
	}
	dir := t.TempDir() // before Cleanup: removed after the members are dead
	for attempt := 1; ; attempt++ {
		c := &Cluster{t: t, opts: opts, token: randomToken()}
		err := c.launch(dir)
		if err == nil {
			t.Cleanup(c.close)
			return c
		}
		if !c.portTaken() || attempt == startAttempts {
			t.Cleanup(c.close)
			t.Fatalf("etcdcluster: %v", err)
		}
		// another process bound a member's port between freePorts' check
		// and the member's bind: start afresh on other ports
		c.close()
		for _, m := range c.members {
			_ = os.RemoveAll(m.dataDir)
			_ = os.Remove(m.logPath)
		}
		t.Logf("etcdcluster: a member's port was taken by another process (attempt %d); starting on other ports", attempt)
	}
}

// startAttempts bounds how often Start draws new ports after a member found
// its port taken.
const startAttempts = 3

// launch draws the members' ports, starts their proxies and processes in
// dir, and waits until every member is ready.
func (c *Cluster) launch(dir string) error {
	opts := c.opts
	ports, err := drawPorts(2 * opts.Members)
	if err != nil {
		return err
	}
	for i := 0; i < opts.Members; i++ {
		m := &member{
			index:     i,
			name:      fmt.Sprintf("m%d", i),
			dataDir:   filepath.Join(dir, fmt.Sprintf("m%d.etcd", i)),
			logPath:   filepath.Join(dir, fmt.Sprintf("m%d.log", i)),
			peerURL:   fmt.Sprintf("http://127.0.0.1:%d", ports[2*i]),
			clientURL: fmt.Sprintf("http://127.0.0.1:%d", ports[2*i+1]),
		}
		c.members = append(c.members, m)
	}
	for _, m := range c.members {
		p, err := newProxy(strings.TrimPrefix(m.clientURL, "http://"))
		if err != nil {
			return fmt.Errorf("proxy: %w", err)
		}
		m.proxy = p
		m.direct, err = newClient([]string{m.clientURL})
		if err != nil {
			return fmt.Errorf("client: %w", err)
		}
	}
	initialCluster := c.initialCluster()
	errs := make(chan error, len(c.members))
	for _, m := range c.members {
		go func() { errs <- c.startMember(m, initialCluster) }()
	}
	var first error
	for range c.members {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		return first
	}
	deadline := time.After(readyTimeout)
	for _, m := range c.members {
		m.mu.Lock()
		p := m.proc
		m.mu.Unlock()
		select {
		case <-p.ready:
		case <-p.exited:
			return fmt.Errorf("member %s exited during start-up (%v); see %s", m.name, p.err, m.logPath)
		case <-deadline:
			return fmt.Errorf("cluster not ready within %v", readyTimeout)
		}
	}
	return nil
}

// portTaken reports whether a member failed because its port was in use.
func (c *Cluster) portTaken() bool {
	for _, m := range c.members {
		if strings.Contains(logTail(m.logPath, logTailOnError), "address already in use") {
			return true
		}
	}
	return false
}

// startMember starts m's process (new cluster the first time, existing
// afterwards).
func (c *Cluster) startMember(m *member, initialCluster string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.proc != nil {
		return fmt.Errorf("member %d: %w", m.index, ErrRunning)
	}
	state := "new"
	if m.started {
		state = "existing"
	}
	mc := memberConfig{
		Name:                m.name,
		Dir:                 m.dataDir,
		PeerURL:             m.peerURL,
		ClientURL:           m.clientURL,
		InitialCluster:      initialCluster,
		InitialClusterState: state,
		InitialClusterToken: c.token,
		TickMs:              c.opts.HeartbeatMs,
		ElectionMs:          c.opts.ElectionMs,
		Fsync:               c.opts.Fsync,
		SnapshotCount:       c.opts.SnapshotCount,
		MaxTxnOps:           c.opts.MaxTxnOps,
		MaxRequestBytes:     c.opts.MaxRequestBytes,
	}
	p, err := startProcess(mc, m.logPath, startTimeout)
	if err != nil {
		return err
	}
	m.proc, m.started = p, true
	return nil
}

func (c *Cluster) initialCluster() string {
	var parts []string
	for _, m := range c.members {
		parts = append(parts, m.name+"="+m.peerURL)
	}
	return strings.Join(parts, ",")
}

// Size returns the number of members.
func (c *Cluster) Size() int { return len(c.members) }

// Endpoints returns the proxies' addresses (host:port), one per member in
// member order. They stay the same across restarts.
func (c *Cluster) Endpoints() []string {
	eps := make([]string, len(c.members))
	for i, m := range c.members {
		eps[i] = m.proxy.addr
	}
	return eps
}

// Endpoint returns member i's proxy address (host:port).
func (c *Cluster) Endpoint(i int) string { return c.member(i).proxy.addr }

// Client returns a client of every member through the proxies, closed by
// t.Cleanup.
func (c *Cluster) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	return c.clientFor(t, c.Endpoints())
}

// MemberClient returns a client of member i alone, through its proxy, closed
// by t.Cleanup.
func (c *Cluster) MemberClient(t testing.TB, i int) *clientv3.Client {
	t.Helper()
	return c.clientFor(t, []string{c.Endpoint(i)})
}

func (c *Cluster) clientFor(t testing.TB, endpoints []string) *clientv3.Client {
	t.Helper()
	cli, err := newClient(endpoints)
	if err != nil {
		t.Fatalf("etcdcluster: client: %v", err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

func newClient(endpoints []string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 2 * time.Second,
		Logger:      zap.NewNop(),
	})
}

// PID returns member i's process id, or 0 when it is not running.
func (c *Cluster) PID(i int) int {
	m := c.member(i)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.proc == nil {
		return 0
	}
	return m.proc.cmd.Process.Pid
}

// Running reports whether member i's process runs (it may not serve yet).
func (c *Cluster) Running(i int) bool { return c.PID(i) != 0 }

// Kill crashes member i with SIGKILL and waits until its process is gone.
func (c *Cluster) Kill(i int) error {
	m := c.member(i)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.proc == nil {
		return fmt.Errorf("kill member %d: %w", i, ErrNotRunning)
	}
	m.proc.kill()
	m.proc = nil
	return nil
}

// Stop stops member i gracefully with SIGTERM (SIGKILL after 10 s) and
// waits until its process is gone. It returns the process's exit error, if
// any.
func (c *Cluster) Stop(i int) error {
	m := c.member(i)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.proc == nil {
		return fmt.Errorf("stop member %d: %w", i, ErrNotRunning)
	}
	err := m.proc.terminate(stopGrace)
	m.proc = nil
	if err != nil {
		return fmt.Errorf("stop member %d: %w", i, err)
	}
	return nil
}

// Restart starts killed or stopped member i again from its data directory
// (initial cluster state "existing"). It returns once the process has bound
// its ports; the member serves only once a quorum runs — use WaitHealthy.
// Restarting every member of a dead cluster therefore works one Restart
// after another.
func (c *Cluster) Restart(i int) error {
	if err := c.startMember(c.member(i), c.initialCluster()); err != nil {
		return fmt.Errorf("restart member %d: %w", i, err)
	}
	return nil
}

// Blackhole makes member i's proxy accept connections but forward nothing in
// either direction; the bytes wait until Heal. Clients with a deadline fail
// with it; the member itself keeps running and stays in the cluster.
func (c *Cluster) Blackhole(i int) error { return c.member(i).proxy.setMode(modeBlackhole) }

// HoldReplies makes member i's proxy forward requests to the member but hold
// every reply until Heal: a write reaches the member and may commit while its
// client times out (an ambiguous outcome).
func (c *Cluster) HoldReplies(i int) error { return c.member(i).proxy.setMode(modeHoldReplies) }

// Drop makes member i's proxy close every connection and refuse new ones.
func (c *Cluster) Drop(i int) error { return c.member(i).proxy.setMode(modeDrop) }

// Heal makes member i's proxy pass traffic again; bytes held by Blackhole or
// HoldReplies are forwarded.
func (c *Cluster) Heal(i int) error { return c.member(i).proxy.setMode(modePass) }

// Leader returns the index of the current leader, polling every member that
// runs (directly, not through the proxies) until one of them reports itself
// leader or ctx ends. When two members claim leadership the one of the
// higher term wins.
func (c *Cluster) Leader(ctx context.Context) (int, error) {
	for {
		if i, ok := c.leaderOnce(ctx); ok {
			return i, nil
		}
		select {
		case <-ctx.Done():
			return -1, fmt.Errorf("etcdcluster: no leader: %w", ctx.Err())
		case <-time.After(pollInterval):
		}
	}
}

func (c *Cluster) leaderOnce(ctx context.Context) (int, bool) {
	statuses := c.statuses(ctx)
	best, bestTerm := -1, uint64(0)
	for i, s := range statuses {
		if s == nil || s.Leader == 0 || s.Header == nil || s.Leader != s.Header.MemberId {
			continue
		}
		if best < 0 || s.RaftTerm > bestTerm {
			best, bestTerm = i, s.RaftTerm
		}
	}
	return best, best >= 0
}

// statuses asks every running member for its Status in parallel; nil for a
// member that is down or does not answer.
func (c *Cluster) statuses(ctx context.Context) []*clientv3.StatusResponse {
	out := make([]*clientv3.StatusResponse, len(c.members))
	var wg sync.WaitGroup
	for i, m := range c.members {
		if !c.Running(i) {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sctx, cancel := context.WithTimeout(ctx, statusTimeout)
			defer cancel()
			if s, err := m.direct.Status(sctx, m.clientURL); err == nil {
				out[i] = s
			}
		}()
	}
	wg.Wait()
	return out
}

// MemberID returns member i's raft member ID, asking it directly.
func (c *Cluster) MemberID(ctx context.Context, i int) (uint64, error) {
	m := c.member(i)
	if !c.Running(i) {
		return 0, fmt.Errorf("member %d: %w", i, ErrNotRunning)
	}
	s, err := m.direct.Status(ctx, m.clientURL)
	if err != nil {
		return 0, fmt.Errorf("etcdcluster: status of member %d: %w", i, err)
	}
	return s.Header.MemberId, nil
}

// WaitHealthy waits until every running member serves, all of them agree on
// one leader, and each answers a linearizable read directly (so it has
// caught up with the leader's commit index). Killed and stopped members are
// not waited for. The proxies are bypassed: a blackholed member can be
// healthy.
func (c *Cluster) WaitHealthy(ctx context.Context) error {
	var last error
	for {
		if last = c.healthyOnce(ctx); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("etcdcluster: not healthy: %w (last: %v)", ctx.Err(), last)
		case <-time.After(pollInterval):
		}
	}
}

func (c *Cluster) healthyOnce(ctx context.Context) error {
	running := 0
	for i, m := range c.members {
		m.mu.Lock()
		p := m.proc
		m.mu.Unlock()
		if p == nil {
			continue
		}
		running++
		if !p.isReady() {
			return fmt.Errorf("member %d not ready", i)
		}
	}
	if running == 0 {
		return errors.New("no member runs")
	}
	var leader uint64
	for i, s := range c.statuses(ctx) {
		if !c.Running(i) {
			continue
		}
		if s == nil {
			return fmt.Errorf("member %d does not answer Status", i)
		}
		if s.Leader == 0 {
			return fmt.Errorf("member %d has no leader", i)
		}
		if leader != 0 && s.Leader != leader {
			return fmt.Errorf("members disagree on the leader")
		}
		leader = s.Leader
	}
	for i, m := range c.members {
		if !c.Running(i) {
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, statusTimeout)
		_, err := m.direct.Get(rctx, "etcdcluster-health")
		cancel()
		if err != nil {
			return fmt.Errorf("member %d read: %w", i, err)
		}
	}
	return nil
}

func (c *Cluster) member(i int) *member {
	if i < 0 || i >= len(c.members) {
		panic(fmt.Sprintf("etcdcluster: member %d out of range [0,%d)", i, len(c.members)))
	}
	return c.members[i]
}

// close kills every member, closes the proxies and clients, and shows the
// members' log tails when the test failed.
func (c *Cluster) close() {
	for _, m := range c.members {
		if m.direct != nil {
			_ = m.direct.Close()
		}
	}
	var wg sync.WaitGroup
	for _, m := range c.members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.mu.Lock()
			if m.proc != nil {
				m.proc.kill()
				m.proc = nil
			}
			m.mu.Unlock()
			if m.proxy != nil {
				m.proxy.close()
			}
		}()
	}
	wg.Wait()
	if c.t.Failed() {
		for _, m := range c.members {
			if tail := logTail(m.logPath, logTailOnError); tail != "" {
				c.t.Logf("etcdcluster: member %s log tail:\n%s", m.name, tail)
			}
		}
	}
}

// logTail returns the last n lines of the file at path.
func logTail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}

// drawPorts is freePorts; a test replaces it to take a port away.
var drawPorts = freePorts

// freePorts returns n distinct loopback ports that were free a moment ago.
//
// They are drawn at random from below the kernel's ephemeral range
// (memberPortLow..memberPortHigh): a port handed out by a ":0" listen or
// taken by an outgoing connection always comes from the ephemeral range, so
// neither can grab a member's port between this check and the member's bind,
// nor while a killed member is down before Restart.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	seen := map[int]bool{}
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			_ = ln.Close()
		}
	}()
	for len(ports) < n {
		ln, err := listenFree(seen)
		if err != nil {
			return nil, err
		}
		port := ln.Addr().(*net.TCPAddr).Port
		seen[port] = true
		lns = append(lns, ln)
		ports = append(ports, port)
	}
	return ports, nil
}

// listenFree listens on a random loopback port from the range freePorts
// draws from, other than those in seen.
func listenFree(seen map[int]bool) (net.Listener, error) {
	for range 1000 {
		var b [2]byte
		_, _ = rand.Read(b[:])
		port := memberPortLow + (int(b[0])<<8|int(b[1]))%(memberPortHigh-memberPortLow)
		if seen[port] || port == 2379 || port == 2380 {
			continue
		}
		if ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			return ln, nil
		}
	}
	return nil, fmt.Errorf("free port: no free port in %d..%d", memberPortLow, memberPortHigh)
}

// The range members' ports are drawn from: below Linux's default ephemeral
// range (32768..60999) and above the well-known ports.
const (
	memberPortLow  = 12000
	memberPortHigh = 32000
)

func randomToken() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "etcdcluster-" + hex.EncodeToString(b[:])
}
