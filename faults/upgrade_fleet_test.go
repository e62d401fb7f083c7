package faults_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	authority "github.com/zlink-systems/authority"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
)

// nodeLine is one report of an upgrade node (faults/upgradenode's Line).
type nodeLine struct {
	Ev      string `json:"ev"`
	Op      string `json:"op"`
	Key     string `json:"key"`
	Ver     int64  `json:"ver"`
	Token   int64  `json:"token"`
	Prev    int64  `json:"prevToken"`
	Gen     int64  `json:"gen"`
	Payload string `json:"payload"`
	Active  int    `json:"active"`
	After   int    `json:"activeAfter"`
	Moved   int64  `json:"moved"`
	Removed int64  `json:"removed"`
	Err     string `json:"err"`
	Build   string `json:"build"`
	node    string
}

const (
	upgradeLimit      = 12 // Spots per node (the nodes' capacity policy)
	upgradeStableType = "upgrade.Spot"
)

// fleet runs upgrade nodes against one etcd and keeps what they report.
type fleet struct {
	t         *testing.T
	endpoints string
	ns        string
	mu        sync.Mutex
	procs     map[string]*nodeProc
	acks      map[string][]nodeLine // by key, in order
	corrupt   []nodeLine            // ErrCorrupt on a read or write of one row
	refused   []nodeLine            // ErrCorrupt on a listing: a row a reader refused
	errs      []nodeLine
	acked     int
}

type nodeProc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	exited chan struct{}
	ready  chan nodeLine
	acks   int // acknowledged writes of this process
}

func newFleet(t *testing.T, endpoints, ns string) *fleet {
	return &fleet{t: t, endpoints: endpoints, ns: ns, procs: map[string]*nodeProc{}, acks: map[string][]nodeLine{}}
}

// start starts node name with bin and waits for it to be ready (its
// previous generation's rows rebound); a node that refuses to start
// returns its refusal.
func (f *fleet) start(name, bin string) (refusal *nodeLine) {
	f.t.Helper()
	cmd := exec.Command(bin, "-endpoints", f.endpoints, "-namespace", f.ns, "-node", name, "-limit", fmt.Sprint(upgradeLimit))
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		f.t.Fatal(err)
	}
	p := &nodeProc{cmd: cmd, exited: make(chan struct{}), ready: make(chan nodeLine, 1)}
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		f.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { _ = cmd.Process.Kill(); <-p.exited })
	go f.read(name, p, stdout)
	select {
	case l := <-p.ready:
		if l.Ev == "refused" || l.Ev == "error" {
			<-p.exited
			return &l
		}
	case <-time.After(3 * time.Minute):
		f.t.Fatalf("node %s (%s) not ready", name, bin)
	}
	f.mu.Lock()
	f.procs[name] = p
	f.mu.Unlock()
	return nil
}

func (f *fleet) read(name string, p *nodeProc, stdout io.Reader) {
	sc := bufio.NewScanner(stdout)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l nodeLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			f.t.Errorf("node %s: %q: %v", name, sc.Bytes(), err)
			continue
		}
		l.node = name
		f.record(p, l)
	}
	_, _ = io.Copy(io.Discard, stdout)
	_ = p.cmd.Wait()
	close(p.exited)
}

func (f *fleet) record(p *nodeProc, l nodeLine) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch l.Ev {
	case "ready", "refused":
		p.ready <- l
	case "ack":
		f.acks[l.Key] = append(f.acks[l.Key], l)
		f.acked++
		p.acks++
	case "corrupt":
		if l.Op == "list" {
			f.refused = append(f.refused, l)
		} else {
			f.corrupt = append(f.corrupt, l)
		}
	case "error":
		if l.Op == "start" {
			p.ready <- l
		}
		f.errs = append(f.errs, l)
	}
}

// waitAcks waits until node name's process acknowledged n writes.
func (f *fleet) waitAcks(name string, n int) {
	f.t.Helper()
	deadline := time.Now().Add(3 * time.Minute) // a bound for a loaded machine, not a measure
	for {
		f.mu.Lock()
		got := f.procs[name].acks
		f.mu.Unlock()
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			f.mu.Lock()
			errs := f.errs[:min(len(f.errs), 5)]
			f.mu.Unlock()
			f.t.Fatalf("node %s acknowledged %d writes of %d (errors: %+v)", name, got, n, errs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop ends node name gracefully (it closes its owner lease) and waits for
// its process.
func (f *fleet) stop(name string) {
	f.t.Helper()
	f.mu.Lock()
	p := f.procs[name]
	delete(f.procs, name)
	f.mu.Unlock()
	_ = p.stdin.Close()
	select {
	case <-p.exited:
	case <-time.After(2 * time.Minute):
		f.t.Fatalf("node %s did not stop", name)
	}
}

// stopAll stops every running node.
func (f *fleet) stopAll() {
	f.mu.Lock()
	var names []string
	for n := range f.procs {
		names = append(names, n)
	}
	f.mu.Unlock()
	for _, n := range names {
		f.stop(n)
	}
}

// lost checks node's acknowledged writes against the rows now stored (read
// with st, once the node's process stopped): a row whose last write was
// acknowledged holds that write, and an acknowledged delete left no row. It
// returns how many acknowledged writes are not there.
func (f *fleet) lost(ctx context.Context, st *etcdstore.Store, node string) int {
	f.t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	lost := 0
	for key, acks := range f.acks {
		if !strings.HasPrefix(key, "user_spot/"+node+"-") {
			continue
		}
		last := acks[len(acks)-1]
		r, err := st.ReadAuthority(ctx, authority.Key(key))
		if err != nil {
			f.t.Errorf("read %s: %v", key, err)
			lost++
			continue
		}
		switch {
		case last.Op == "delete":
			if r.Kind != authority.KindMissing {
				f.t.Errorf("%s: deleted (acknowledged), but present", key)
				lost++
			}
		case r.Kind != authority.KindSnapshot || string(r.Snapshot.Payload) != last.Payload ||
			string(r.Snapshot.StoreVersion) != fmt.Sprint(last.Ver):
			f.t.Errorf("%s: acknowledged %s at %d (%q), stored %s", key, last.Op, last.Ver, last.Payload, describe(r))
			lost++
		}
	}
	return lost
}

// tokenViolations checks every key's acknowledged writes against the token
// rule: a token never goes back; a put keeps it; a rebind (new lease
// generation) takes a new one; a same-owner aggregate move takes a new one
// at Base and keeps it from TokenFollowsOwner on. It returns the
// violations and how many moves kept their token.
func (f *fleet) tokenViolations() (violations, kept int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for key, acks := range f.acks {
		var last int64
		for _, a := range acks {
			ok := a.Op == "delete" || a.Token >= last
			switch a.Op {
			case "put":
				ok = ok && a.Token == a.Prev
			case "rebound":
				ok = ok && a.Token > last
			case "selfagg":
				switch {
				case a.Active >= 2 && a.After >= 2:
					ok, kept = ok && a.Token == a.Prev, kept+1
				case a.Active < 2 && a.After < 2:
					ok = ok && a.Token > a.Prev
				}
			}
			if !ok {
				f.t.Errorf("%s: token rule broken by %s: token %d (before %d, last %d, versions %d/%d)", key, a.Op, a.Token, a.Prev, last, a.Active, a.After)
				violations++
			}
			if a.Op != "delete" {
				last = a.Token
			} else {
				last = 0
			}
		}
	}
	return violations, kept
}

// capacityWatch polls every node's capacity usage until ctx ends and
// returns a function reporting the most any node held and how many polls
// saw more than the limit.
func capacityWatch(ctx context.Context, st *etcdstore.Store, nodes []string) func() (most int64, over int) {
	var mu sync.Mutex
	var most int64
	var over int
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			for _, n := range nodes {
				u, err := st.CapacityUsage(ctx, authority.NodeDescriptor{MeshName: "upgrade", RID: n}, 1, authority.ObjectUserSpot, upgradeStableType)
				if err != nil {
					continue
				}
				mu.Lock()
				most = max(most, u.Active+u.Reserved)
				if u.Active+u.Reserved > upgradeLimit {
					over++
				}
				mu.Unlock()
			}
			sleepCtx(ctx, 50*time.Millisecond)
		}
	}()
	return func() (int64, int) {
		<-done
		mu.Lock()
		defer mu.Unlock()
		return most, over
	}
}

// eventuallyTrue polls cond until it holds, failing t after three minutes
// (a bound for a loaded machine, not a measure).
func eventuallyTrue(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// describe says what a read found.
func describe(r authority.ReadResult) string {
	if r.Snapshot == nil {
		return string(r.Kind)
	}
	return fmt.Sprintf("%s at %s (%q)", r.Kind, r.Snapshot.StoreVersion, r.Snapshot.Payload)
}
