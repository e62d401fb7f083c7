package faults_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdcluster"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
)

const (
	// churnRun is how long leaders are churned at least (AUTHORITY_SOAK:
	// longer); it keeps going until leaders changed with leases lost and
	// writes acknowledged (keepGoing).
	churnRun = 16 * time.Second
	// churnOwnerTTL is the owners' lease TTL; a leader paused for
	// churnPause is longer than that, so the owner talking only to it loses
	// its lease.
	churnOwnerTTL = 2 * time.Second
	churnPause    = 3 * time.Second
	// churnProbeTTL is the TTL of the lease whose remaining time is read
	// around each leader change.
	churnProbeTTL = 6 * time.Second
)

// churnOwner is one owner of the leader churn test: its own store on a
// client of one member only, writing its row while its lease holds.
type churnOwner struct {
	id     string
	st     *etcdstore.Store
	row    authority.Key
	lease  *etcdstore.OwnerLease
	mu     sync.Mutex
	acks   []churnAck          // acknowledged writes
	doneAt map[int64]time.Time // lease generation → when Done closed (lost, not closed by us)
	tokens []authority.OwnerToken
}

// churnAck is one acknowledged write.
type churnAck struct {
	gen  int64
	sent time.Time
	rev  int64
}

// TestLeaderChurnOwnerLeases: with lease checkpointing off (etcd's
// default), leaders are changed again and again — moved, or frozen with
// SIGSTOP for longer than the owners' lease TTL and resumed — while three
// owners, each talking to one member only, hold leases and write their
// rows. No acknowledged write applied after etcd expired its owner's lease,
// and every lease that was lost closed its Done before etcd deleted its
// liveness key (an independent watch): the deadline Done promised held,
// although leader changes pushed etcd's expiry out. How far a leader change
// extends a lease is measured on a probe lease with LeaseTimeToLive.
func TestLeaderChurnOwnerLeases(t *testing.T) {
	c, cli := startCluster(t, etcdcluster.Options{})
	const ns = "/faults/leader-churn/"
	expiries := watchLivenessDeletes(t, cli, ns)
	owners := make([]*churnOwner, c.Size())
	for i := range owners {
		owners[i] = newChurnOwner(t, newStore(t, c.MemberClient(t, i), ns), fmt.Sprintf("churn-%d", i))
	}
	probe := &churnProbe{cli: cli}
	if !probe.grant(settle(t)) {
		t.Fatal("no probe lease")
	}

	planned := churnRun
	if soak() {
		planned = 2 * time.Minute
	}
	var changes atomic.Int64
	run := keepGoing(planned, func() bool {
		lost, acks := 0, 0
		for _, o := range owners {
			l, a := o.progress()
			lost, acks = lost+l, acks+a
		}
		return changes.Load() >= 3 && lost > 0 && acks > 0
	})
	defer run.stop()
	ctx := run.ctx
	var wg sync.WaitGroup
	for _, o := range owners {
		wg.Add(1)
		go func() { defer wg.Done(); o.run(ctx, t) }()
	}
	maxExt := churnLeaders(ctx, t, c, probe, &changes)
	wg.Wait()
	_, ran := run.report()
	elections := int(changes.Load())
	waitHealthy(t, c)

	after, late, lost, acks := 0, 0, 0, 0
	var tokens []authority.OwnerToken
	for _, o := range owners {
		tokens = append(tokens, o.tokens...)
	}
	exp := expiries.snapshot(t, cli, tokens)
	for _, o := range owners {
		a, l, n, k := o.check(t, exp)
		after, late, lost, acks = after+a, late+l, lost+n, acks+k
	}
	t.Logf("leader-churn: ran %.1fs (planned %v) elections=%d writes-after-deadline=%d max-lease-extension=%.1fs (a %v lease with no keep-alive outlived its TTL by up to %.1fs, expired %d times; done-after-expiry=%d leases-lost=%d acked-writes=%d)",
		ran.Seconds(), planned, elections, after, maxExt.Seconds(), churnProbeTTL, probe.outlived.Seconds(), probe.expired, late, lost, acks)
	if after != 0 || late != 0 {
		t.Errorf("writes-after-deadline=%d done-after-expiry=%d", after, late)
	}
	if elections < 3 || acks == 0 || lost == 0 {
		t.Errorf("the run did not change leaders with leases lost and writes acknowledged (elections=%d lost=%d acks=%d)", elections, lost, acks)
	}
}

// newChurnOwner acquires a lease for id through st and creates its row.
func newChurnOwner(t *testing.T, st *etcdstore.Store, id string) *churnOwner {
	t.Helper()
	o := &churnOwner{id: id, st: st, row: objectKey(t, authority.ObjectUserSpot, id), doneAt: map[int64]time.Time{}}
	if !o.acquire(context.Background()) {
		t.Fatalf("owner %s: no lease", id)
	}
	tgt := conformance.Target(conformance.NodeA, conformance.NodeLifecycle, o.lease.Token())
	mustCommit(t, st, mustReserve(t, st, reserveRequest(authority.ObjectUserSpot, id, tgt, id)), id+"-ready")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		_ = o.lease.Close(ctx)
	})
	return o
}

// acquire takes a new lease generation (retrying for a while) and moves
// the owner's row onto it.
func (o *churnOwner) acquire(ctx context.Context) bool {
	deadline := time.Now().Add(settleTimeout)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		actx, cancel := context.WithTimeout(ctx, opTimeout)
		l, err := o.st.Registry().Acquire(actx, conformance.NodeA, conformance.NodeLifecycle, o.id, churnOwnerTTL)
		cancel()
		if err == nil {
			o.mu.Lock()
			if o.lease != nil {
				_, _ = l.RebindRows(ctx, o.lease.Token()) // a failure leaves the row on the old one: writes fail
			}
			o.lease = l
			o.tokens = append(o.tokens, l.Token())
			o.mu.Unlock()
			go o.recordDone(l)
			return true
		}
		time.Sleep(retryPause)
	}
	return false
}

// recordDone records when l's Done closed. It waits on Done itself: the
// run loop notices Done only between writes, which can take seconds while
// leaders change, and that delay is not the lease's. A lease we close at
// cleanup records after the check, which no longer looks.
func (o *churnOwner) recordDone(l *etcdstore.OwnerLease) {
	<-l.Done()
	at := time.Now()
	o.mu.Lock()
	o.doneAt[l.Token().LeaseGeneration] = at
	o.mu.Unlock()
}

// run writes the owner's row while its lease holds; when Done closes it
// records when and acquires the next generation.
func (o *churnOwner) run(ctx context.Context, t *testing.T) {
	for n := 0; ctx.Err() == nil; n++ {
		l := o.lease
		select {
		case <-l.Done():
			if !o.acquire(ctx) {
				return
			}
			continue
		default:
		}
		o.write(ctx, l, fmt.Sprintf("%s-%d", o.id, n))
		sleepCtx(ctx, 10*time.Millisecond)
	}
}

// write puts payload on the owner's row at its current version.
func (o *churnOwner) write(ctx context.Context, l *etcdstore.OwnerLease, payload string) {
	octx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	r, err := o.st.ReadAuthority(octx, o.row)
	if err != nil || r.Kind != authority.KindSnapshot || r.Snapshot.Owner() != l.Token() {
		return
	}
	select { // the owner's discipline: no write once Done closed or Deadline passed
	case <-l.Done():
		return
	default:
	}
	sent := time.Now()
	if !sent.Before(l.Deadline()) {
		return
	}
	res, err := o.st.CompareExchangeAuthority(octx, o.row, r.Snapshot.StoreVersion, authority.Put([]byte(payload)))
	if err != nil || res.Kind != authority.KindStored {
		return
	}
	rev, _ := strconv.ParseInt(string(res.Snapshot.StoreVersion), 10, 64)
	o.mu.Lock()
	o.acks = append(o.acks, churnAck{gen: l.Token().LeaseGeneration, sent: sent, rev: rev})
	o.mu.Unlock()
}

// progress returns how many leases the owner lost and how many of its
// writes were acknowledged so far.
func (o *churnOwner) progress() (lost, acks int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.doneAt), len(o.acks)
}

// check counts the owner's acknowledged writes applied after etcd expired
// their lease, and its lost leases whose
// Done closed only after etcd expired them. It returns those two counts,
// how many leases it lost and how many writes were acknowledged.
func (o *churnOwner) check(t *testing.T, exp map[authority.OwnerToken]livenessDelete) (after, late, lost, acks int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, a := range o.acks {
		tok := authority.OwnerToken{OwnerID: o.id, LeaseGeneration: a.gen}
		if d, ok := exp[tok]; ok && a.rev > d.rev {
			after++
			t.Errorf("owner %s: a write of lease generation %d sent at %v applied at revision %d, after etcd expired the lease at %d",
				o.id, a.gen, a.sent.Format(time.StampMilli), a.rev, d.rev)
		}
	}
	for gen, at := range o.doneAt {
		lost++
		d, ok := exp[authority.OwnerToken{OwnerID: o.id, LeaseGeneration: gen}]
		if ok && d.seen.Before(at) {
			late++
			t.Errorf("owner %s: generation %d's Done closed %v after etcd expired the lease", o.id, gen, at.Sub(d.seen))
		}
	}
	return after, late, lost, len(o.acks)
}

// churnProbe is a lease nobody keeps alive, read around each leader change.
type churnProbe struct {
	cli      *clientv3.Client
	id       clientv3.LeaseID
	granted  time.Time
	outlived time.Duration // the longest any probe lived past its TTL
	expired  int
}

// grant grants a new probe lease.
func (p *churnProbe) grant(ctx context.Context) bool {
	rctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	resp, err := p.cli.Grant(rctx, int64(churnProbeTTL/time.Second))
	if err != nil {
		return false
	}
	p.id, p.granted = resp.ID, time.Now()
	return true
}

// ttl reads the probe's remaining TTL and when it was read; a probe that
// expired is replaced (ok false).
func (p *churnProbe) ttl(ctx context.Context) (time.Duration, time.Time, bool) {
	for range 20 {
		rctx, cancel := context.WithTimeout(ctx, opTimeout)
		resp, err := p.cli.TimeToLive(rctx, p.id)
		cancel()
		if err == nil && resp.TTL > 0 {
			p.outlived = max(p.outlived, time.Since(p.granted)-churnProbeTTL)
			return time.Duration(resp.TTL) * time.Second, time.Now(), true
		}
		if err == nil { // expired
			p.expired++
			p.grant(ctx)
			return 0, time.Time{}, false
		}
		if ctx.Err() != nil {
			break
		}
		time.Sleep(retryPause)
	}
	return 0, time.Time{}, false
}

// churnLeaders changes the leader until ctx ends, alternately moving it and
// pausing it for churnPause, and measures how each change extended the
// probe lease (its remaining TTL after the change, less what it would have
// had without one). It counts the leader changes in elections and returns
// the largest extension.
func churnLeaders(ctx context.Context, t *testing.T, c *etcdcluster.Cluster, probe *churnProbe, elections *atomic.Int64) time.Duration {
	var maxExt time.Duration
	for round := 0; sleepCtx(ctx, 500*time.Millisecond); round++ {
		leader, err := c.Leader(ctx)
		if err != nil {
			return maxExt
		}
		before, at, ok := probe.ttl(ctx)
		if round%2 == 0 {
			moveLeader(ctx, c, leader)
		} else {
			if err := c.Pause(leader); err != nil {
				t.Errorf("pause: %v", err)
				return maxExt
			}
			sleepCtx(ctx, churnPause)
			if err := c.Resume(leader); err != nil {
				t.Fatalf("resume: %v", err)
			}
		}
		hctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
		err = c.WaitHealthy(hctx)
		cancel()
		if err != nil {
			t.Fatalf("after a leader change: %v", err)
		}
		if next, err := c.Leader(context.Background()); err == nil && next != leader {
			elections.Add(1)
		}
		if after, at2, ok2 := probe.ttl(context.Background()); ok && ok2 {
			maxExt = max(maxExt, after-(before-at2.Sub(at)))
		}
	}
	return maxExt
}

// moveLeader asks leader to hand leadership to the next member.
func moveLeader(ctx context.Context, c *etcdcluster.Cluster, leader int) {
	to := (leader + 1) % c.Size()
	id, err := c.MemberID(ctx, to)
	if err != nil {
		return
	}
	mctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{c.Endpoint(leader)}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return
	}
	defer cli.Close()
	_, _ = cli.MoveLeader(mctx, id)
}

// livenessDelete is etcd's deletion of a liveness key: the revision and
// when an independent watch saw it.
type livenessDelete struct {
	rev  int64
	seen time.Time
}

// livenessDeletes records the deletions of every liveness key under a
// namespace, from a raw watch.
type livenessDeletes struct {
	ns       string
	ctx      context.Context // the watch's
	mu       sync.Mutex
	byKey    map[string]livenessDelete
	progress atomic.Int64
}

// watchLivenessDeletes starts recording liveness deletions under ns.
func watchLivenessDeletes(t *testing.T, cli *clientv3.Client, ns string) *livenessDeletes {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	d := &livenessDeletes{ns: ns, ctx: ctx, byKey: map[string]livenessDelete{}}
	wch := cli.Watch(ctx, schema.Prefix(ns, schema.EntryOwnerLiveness), clientv3.WithPrefix())
	go func() {
		defer close(done)
		for wr := range wch {
			now := time.Now()
			d.mu.Lock()
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete {
					d.byKey[string(ev.Kv.Key)] = livenessDelete{rev: ev.Kv.ModRevision, seen: now}
				}
			}
			d.mu.Unlock()
			d.progress.Store(wr.Header.Revision)
		}
	}()
	return d
}

// snapshot returns the deletions of the liveness keys of tokens recorded
// so far, once the watch has caught up with the cluster's current revision.
func (d *livenessDeletes) snapshot(t *testing.T, cli *clientv3.Client, tokens []authority.OwnerToken) map[authority.OwnerToken]livenessDelete {
	t.Helper()
	var rev int64
	eventually(t, "revision", func(ctx context.Context) error {
		resp, err := cli.Put(ctx, d.ns+"liveness-probe", "")
		if err == nil {
			rev = resp.Header.Revision
		}
		return err
	})
	deadline := time.Now().Add(settleTimeout)
	for d.progress.Load() < rev {
		if time.Now().After(deadline) {
			t.Fatalf("the liveness watch did not reach revision %d", rev)
		}
		_ = cli.RequestProgress(d.ctx)
		time.Sleep(50 * time.Millisecond)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[authority.OwnerToken]livenessDelete{}
	for key, del := range d.byKey {
		for _, tok := range tokens {
			if strings.HasPrefix(key, schema.OwnerLivenessPrefix(d.ns, tok)) {
				out[tok] = del
			}
		}
	}
	return out
}
