package faults_test

import (
	"context"
	"encoding/json"
	"fmt"
	"syscall"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdcluster"
	etcd "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/sharded"
	"github.com/zlink-systems/authority/provider/sharded/twophase"
)

// shard2PCSoakRounds is how often the trials are run with AUTHORITY_SOAK
// set (once without).
const shard2PCSoakRounds = 5

// shard2PCFinisher is what the other store instance does after the
// committing process died.
type shard2PCFinisher int

const (
	finishByCommit shard2PCFinisher = iota // CommitAggregate of the fence
	finishByAbort                          // AbortAggregate of the fence
	finishByWrite                          // a CAS of a participant at its version before
	finishByRead                           // a read of a participant
	finisherCount
)

func (f shard2PCFinisher) String() string { return [...]string{"commit", "abort", "write", "read"}[f] }

// shard2PCTally counts trials for the figure line.
type shard2PCTally struct {
	trials, partial, committed, notCommitted, killed, finishedByOther int
	steps                                                             map[string]int // by operation
}

// shard2PCBench is the clusters the trials share and the other store
// instance: a sharded store over them (its shard map and key placement) and
// a two-phase coordinator over its shards' stores, which finishes what each
// killed process left. Rows are written and read through the shards'
// stores, whose row versions the coordinator compares.
type shard2PCBench struct {
	clusters  []*etcdcluster.Cluster
	ns        string
	st        *sharded.Store
	coord     *twophase.Coordinator
	raw       []*clientv3.Client
	endpoints [][]string
	n         int
}

// shard2PCScenario is one trial's aggregate: a User Spot in each shard,
// active on TargetA; the one in shard newOwner moves to TargetB, the others
// stay (preserve); every participant gets the payload "aggregate:<key>".
type shard2PCScenario struct {
	keys   []authority.Key
	before map[authority.Key]*authority.Snapshot
	moved  authority.Key
	req    authority.AggregatePrepareRequest
}

// shard2PCTrial is one trial: op ("commit" or "abort") through a process
// killed at kill ("" never, else envShard2PCKill's value), then fin
// through the other instance.
type shard2PCTrial struct {
	op, kill string
	fin      shard2PCFinisher
}

// TestShardAggregateKilledProcess: a child process (a sharded store over
// three clusters, one member each, committing through the two-phase
// coordinator) prepares an aggregate of three rows, one in each shard, and
// commits or aborts it; it kills itself (SIGKILL) before or after each of
// the calls it makes to a shard's store in turn (envShard2PCKill), one
// process per trial. After each death another store instance commits,
// aborts, writes or reads the aggregate's rows (two of these after each
// kill, each of them after a kill at every step; with AUTHORITY_SOAK set
// all four after each kill, the whole set 5 times), then settles it; the aggregate must be
// applied in all its rows or none, with no row lock left, the moved row's
// owner as its outcome says, and in the end every node's capacity exactly
// what the committed aggregates moved. It prints
//
//	aggregate-2pc: trials=… partial=0 processes=… committed=… not-committed=… killed=… finished-by-other=… steps=commit:12,abort:9
func TestShardAggregateKilledProcess(t *testing.T) {
	b := newShard2PCBench(t)
	y := &shard2PCTally{steps: map[string]int{}}
	rounds := 1
	if soak() {
		rounds = shard2PCSoakRounds
	}
	for range rounds {
		for _, op := range []string{"commit", "abort"} {
			// a process nobody kills counts the steps
			_, y.steps[op] = b.trial(t, shard2PCTrial{op: op, fin: finishByRead}, y)
			for m, mode := range []string{"before", "after"} {
				for at := 1; at <= y.steps[op]; at++ {
					for _, fin := range shard2PCFinishers(at, m) {
						if killed, _ := b.trial(t, shard2PCTrial{op: op, kill: fmt.Sprintf("%s:%d", mode, at), fin: fin}, y); !killed {
							t.Fatalf("%s: the process was not killed at %s:%d of %d steps", op, mode, at, y.steps[op])
						}
					}
				}
			}
		}
	}
	b.requireCapacity(t, y)
	t.Logf("aggregate-2pc: trials=%d partial=%d processes=%d committed=%d not-committed=%d killed=%d finished-by-other=%d steps=commit:%d,abort:%d",
		y.trials, y.partial, y.trials, y.committed, y.notCommitted, y.killed, y.finishedByOther, y.steps["commit"], y.steps["abort"])
	if y.partial != 0 {
		t.Errorf("%d aggregates were applied in some rows only", y.partial)
	}
	if y.steps["commit"] == 0 || y.steps["abort"] == 0 || y.committed == 0 || y.notCommitted == 0 {
		t.Error("the trials did not both commit and not commit aggregates: they test nothing")
	}
}

// shard2PCFinishers returns the finishers of the trials killed at step at
// in mode m (0 before, 1 after): two of the four, the other two in the
// other mode, so each finisher meets each step; all four with
// AUTHORITY_SOAK set.
func shard2PCFinishers(at, m int) []shard2PCFinisher {
	if soak() {
		return []shard2PCFinisher{finishByCommit, finishByAbort, finishByWrite, finishByRead}
	}
	first := (at + 2*m) % int(finisherCount)
	return []shard2PCFinisher{shard2PCFinisher(first), shard2PCFinisher((first + 1) % int(finisherCount))}
}

func newShard2PCBench(t *testing.T) *shard2PCBench {
	b := &shard2PCBench{clusters: startShardClusters(t, etcdcluster.Options{}, 1, 1, 1), ns: "/faults/shard-2pc/"}
	b.st = openSharded(t, b.clusters, b.ns, shard2PCTimeout)
	shards := make([]twophase.Shard, b.st.Shards())
	for i := range shards {
		shards[i] = twophase.EtcdShard(b.st.Shard(i))
		b.raw = append(b.raw, b.clusters[i].Client(t))
		b.endpoints = append(b.endpoints, b.clusters[i].Endpoints())
	}
	var err error
	if b.coord, err = twophase.New(shards, shard2PCRouter{b.st}); err != nil {
		t.Fatal(err)
	}
	for _, tgt := range []authority.CreationTarget{conformance.TargetA, conformance.TargetB} {
		eventually(t, "mark live", func(ctx context.Context) error {
			return b.st.MarkLive(ctx, tgt.Descriptor(), tgt.NodeLifecycleGeneration, tgt.Owner, ownerTTL)
		})
	}
	return b
}

// scenario makes trial n's rows and aggregate; the aggregate's record lives
// in shard n mod 3, the moved row in shard n/3 mod 3.
func (b *shard2PCBench) scenario(t *testing.T) *shard2PCScenario {
	t.Helper()
	n := b.n
	b.n++
	sc := &shard2PCScenario{before: map[authority.Key]*authority.Snapshot{}}
	shards := b.st.Shards()
	var parts []authority.AggregateParticipant
	for s := range shards {
		id := idsInShard(t, b.st.ShardOf, authority.ObjectUserSpot, fmt.Sprintf("a%d-s%d-", n, s), s, 1)[0]
		key := objectKey(t, authority.ObjectUserSpot, id)
		row, err := placeActive(b.st.Shard(s), conformance.TargetA, id)
		if err != nil {
			t.Fatal(err)
		}
		sc.keys, sc.before[key] = append(sc.keys, key), row
		transition := authority.TransitionPreserve
		if s == n/shards%shards {
			transition, sc.moved = authority.TransitionNewOwner, key
		}
		parts = append(parts, conformance.Participant(key, row.StoreVersion, transition, payloadOf(key)))
	}
	sc.req = conformance.AggregateRequest(fmt.Sprintf("agg%d-c%d", n, n%shards), 1, conformance.TargetB,
		conformance.Capacity(authority.ObjectUserSpot, conformance.DefaultStableType), parts...)
	return sc
}

// payloadOf is the payload an aggregate gives the row at key.
func payloadOf(key authority.Key) []byte { return []byte("aggregate:" + string(key)) }

// trial runs one trial and reports whether the process was killed and, when
// it was not, how many steps it made.
func (b *shard2PCBench) trial(t *testing.T, tr shard2PCTrial, y *shard2PCTally) (killed bool, steps int) {
	t.Helper()
	sc := b.scenario(t)
	killed, done, last := b.runChild(t, sc, tr)
	if !killed {
		want := map[string]authority.ResultKind{"commit": authority.KindCommitted, "abort": authority.KindAborted}[tr.op]
		if done.Err != "" || done.Prepare != authority.KindPrepared || done.Kind != want {
			t.Fatalf("%s not killed at %q: prepare %s, %s (%s), want prepared, %s", tr.op, tr.kill, done.Prepare, done.Kind, done.Err, want)
		}
	}
	if rec := b.record(t, sc); killed && (rec != nil && !rec.Finished || b.locks(t, sc) > 0) {
		y.finishedByOther++
	}
	after := b.finish(t, sc, tr.fin)
	committed := b.settle(t, sc)
	after(committed)
	y.trials++
	if b.partial(t, sc, committed) {
		y.partial++
		t.Errorf("trial %s killed %q (at %s) finished by %s: partial", tr.op, tr.kill, last, tr.fin)
	}
	if committed {
		y.committed++
	} else {
		y.notCommitted++
	}
	if killed {
		y.killed++
	}
	return killed, done.Step
}

// runChild runs the committing process of sc until it exits; it reports
// whether it was killed, its done line (not killed), and the last step it
// reported (killed).
func (b *shard2PCBench) runChild(t *testing.T, sc *shard2PCScenario, tr shard2PCTrial) (killed bool, done shard2PCLine, last string) {
	t.Helper()
	t.Setenv(envShard2PCKill, tr.kill)
	var lines []shard2PCLine
	p := startChild(t, envShard2PCChild, shard2PCConfig{Endpoints: b.endpoints, Namespace: b.ns, Op: tr.op, Request: sc.req},
		func(raw []byte) {
			var l shard2PCLine
			if json.Unmarshal(raw, &l) == nil {
				lines = append(lines, l)
			}
		})
	<-p.exited // lines is complete once the process is reaped
	ws, _ := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	switch {
	case ws.Signaled() && ws.Signal() == syscall.SIGKILL:
		if len(lines) > 0 {
			l := lines[len(lines)-1]
			last = fmt.Sprintf("step %d %s in shard %d, returned=%v", l.Step, l.Call, l.Shard, l.Returned)
		}
		return true, done, last
	case !p.cmd.ProcessState.Success():
		t.Fatalf("the committing process failed: %v", p.cmd.ProcessState)
	}
	if len(lines) == 0 || lines[len(lines)-1].Event != "done" {
		t.Fatalf("the committing process ended without its result")
	}
	return false, lines[len(lines)-1], ""
}

// record reads the aggregate's record in its coordinator shard (nil: none).
func (b *shard2PCBench) record(t *testing.T, sc *shard2PCScenario) *etcd.CrossRecord {
	t.Helper()
	cs := twophase.EtcdShard(b.st.Shard(shard2PCRouter{b.st}.CoordinatorOf(sc.req.AggregateID)))
	var rec *etcd.CrossRecord
	eventually(t, "read record", func(ctx context.Context) error {
		var err error
		rec, err = cs.ReadRecord(ctx, sc.req.Fence())
		return err
	})
	return rec
}

// locks counts the row locks on sc's rows.
func (b *shard2PCBench) locks(t *testing.T, sc *shard2PCScenario) int {
	t.Helper()
	n := 0
	for _, key := range sc.keys {
		s := b.st.ShardOf(key)
		resp, err := b.raw[s].Get(settle(t), schema.NewLayout(b.ns).RowLock(key), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		n += int(resp.Count)
	}
	return n
}

// finish runs fin through the other instance and returns the check of its
// answer against the settled outcome.
func (b *shard2PCBench) finish(t *testing.T, sc *shard2PCScenario, fin shard2PCFinisher) func(committed bool) {
	t.Helper()
	ctx := settle(t)
	key := sc.keys[1]
	switch fin {
	case finishByCommit:
		res, err := b.coord.CommitAggregate(ctx, sc.req.Fence())
		if err != nil {
			t.Fatalf("commit: %v", err)
		}
		return func(committed bool) {
			if ok := res.Kind == authority.KindCommitted || res.Kind == authority.KindAlreadyCommitted; ok != committed {
				t.Errorf("commit answered %s, the aggregate committed=%v", res.Kind, committed)
			}
		}
	case finishByAbort:
		res, err := b.coord.AbortAggregate(ctx, sc.req.Fence())
		if err != nil {
			t.Fatalf("abort: %v", err)
		}
		return func(committed bool) {
			if (res.Kind == authority.KindAborted || res.Kind == authority.KindAlreadyAborted) && committed {
				t.Errorf("abort answered %s, and the aggregate committed", res.Kind)
			}
		}
	case finishByWrite:
		var res authority.CompareExchangeResult
		err := b.coord.Retry(ctx, func(ctx context.Context) error {
			var err error
			res, err = b.st.Shard(b.st.ShardOf(key)).CompareExchangeAuthority(ctx, key, sc.before[key].StoreVersion, authority.Put([]byte("writer")))
			return err
		})
		if err != nil {
			t.Fatalf("write: %v", err)
		}
		return func(committed bool) {
			// ordered before the commit (then stale) or after it (a conflict)
			if (res.Kind == authority.KindConflict) != committed {
				t.Errorf("the write answered %s, the aggregate committed=%v", res.Kind, committed)
			}
		}
	default:
		res, err := b.coord.ReadAuthority(ctx, key)
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		return func(committed bool) {
			if res.Kind == authority.KindSnapshot && string(res.Snapshot.Payload) == string(payloadOf(key)) && !committed {
				t.Error("a read saw the aggregate's payload of an aggregate not committed")
			}
		}
	}
}

// settle ends the aggregate through the other instance: a prepared one is
// aborted, a decided one finished. It reports whether it committed.
func (b *shard2PCBench) settle(t *testing.T, sc *shard2PCScenario) bool {
	t.Helper()
	ctx := settle(t)
	if rec := b.record(t, sc); rec != nil && rec.State == schema.AggregatePrepared {
		res, err := b.coord.AbortAggregate(ctx, sc.req.Fence())
		if err != nil || res.Kind != authority.KindAborted {
			t.Fatalf("abort a prepared aggregate: %s %v", res.Kind, err)
		}
		return false
	}
	res, err := b.coord.CommitAggregate(ctx, sc.req.Fence())
	if err != nil {
		t.Fatalf("settle: %v", err)
	}
	return res.Kind == authority.KindAlreadyCommitted
}

// partial reports whether the settled aggregate is applied in some rows
// only, a row lock is left, or the moved row's owner disagrees with the
// outcome; it reads each row in its shard without resolving locks.
func (b *shard2PCBench) partial(t *testing.T, sc *shard2PCScenario, committed bool) bool {
	t.Helper()
	applied := 0
	for _, key := range sc.keys {
		res := mustRead(t, b.st.Shard(b.st.ShardOf(key)), key)
		if res.Kind != authority.KindSnapshot {
			t.Fatalf("row %s: %s", key, res.Kind)
		}
		if string(res.Snapshot.Payload) == string(payloadOf(key)) {
			applied++
		}
		if key == sc.moved && (res.Snapshot.Owner() == conformance.TargetB.Owner) != committed {
			t.Errorf("moved row %s is owned by %+v, the aggregate committed=%v", key, res.Snapshot.Owner(), committed)
			return true
		}
	}
	want := 0
	if committed {
		want = len(sc.keys)
	}
	if locks := b.locks(t, sc); locks != 0 {
		t.Errorf("%d row locks left", locks)
		return true
	}
	return applied != want
}

// requireCapacity requires every node's Spot capacity, summed over the
// shards, to be what the trials left: each trial placed 3 Spots on TargetA
// and each committed aggregate moved one to TargetB; nothing reserved.
func (b *shard2PCBench) requireCapacity(t *testing.T, y *shard2PCTally) {
	t.Helper()
	want := map[authority.CreationTarget]int64{
		conformance.TargetA: int64(b.n*b.st.Shards() - y.committed),
		conformance.TargetB: int64(y.committed),
	}
	for tgt, active := range want {
		var u authority.CapacityUsage
		eventually(t, "capacity usage", func(ctx context.Context) error {
			var err error
			u, err = b.st.CapacityUsage(ctx, tgt.Descriptor(), tgt.NodeLifecycleGeneration, authority.CounterSpots, "")
			return err
		})
		if u.Active != active || u.Reserved != 0 {
			t.Errorf("node %s: active=%d reserved=%d, want %d and 0", tgt.Descriptor().RID, u.Active, u.Reserved, active)
		}
	}
}
