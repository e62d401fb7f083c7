package faults_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdcluster"
	"github.com/zlink-systems/authority/provider/sharded"
)

const (
	// outageShards is the shard count of the outage test, each shard a
	// one-member cluster.
	outageShards = 3
	// outageWritersPerShard write rows of one shard each.
	outageWritersPerShard = 4
	// outageWriteTimeout bounds one write: a write of a healthy shard that
	// does not succeed within it counts as failed (generous: the machine
	// is loaded). A write of the down shard waits for its cluster until it.
	outageWriteTimeout = 10 * time.Second
	// outageBound bounds each phase's wait for its outcomes.
	outageBound = 3 * settleTimeout
)

// The phases of an outage round; a write belongs to the phase it started in.
const (
	phaseBefore = iota // every cluster up
	phaseOutage        // the down shard's cluster killed
	phaseAfter         // restarted and healthy
	phaseCount
)

// outageSoakRounds is how many outages the test runs with AUTHORITY_SOAK set
// (one without), each round the next shard's cluster down.
const outageSoakRounds = 6

// outageCounts are the outcomes of the writes of one shard in one phase.
type outageCounts struct {
	acked, unavailable, unknown, other int
}

// outageLedger records what the writers were told.
type outageLedger struct {
	mu     sync.Mutex
	counts [][outageShards][phaseCount]outageCounts // by round
	// acked: rows whose reserve and commit were acknowledged (their ready
	// payload); reserved: rows whose reserve was acknowledged and whose
	// commit failed (their creating payload).
	acked, reserved map[authority.Key]string
	firstOther      error
	unknownErrs     []string
}

func (l *outageLedger) count(round, shard, phase int, f func(*outageCounts) int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return f(&l.counts[round][shard][phase])
}

// record files one write's outcome: err nil (acknowledged), or the error of
// its reserve (reserved false) or of its commit.
func (l *outageLedger) record(stage, shard int, key authority.Key, creating, ready string, reserved bool, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	round, phase := stage/phaseCount, stage%phaseCount
	c := &l.counts[round][shard][phase]
	switch {
	case err == nil:
		c.acked++
		l.acked[key] = ready
		return
	case errors.Is(err, authority.ErrUnavailable):
		c.unavailable++
	case errors.Is(err, authority.ErrOutcomeUnknown):
		c.unknown++
		l.unknownErrs = append(l.unknownErrs, fmt.Sprintf("round %d, shard %d, phase %d: %v", round, shard, phase, err))
	default:
		c.other++
		if l.firstOther == nil {
			l.firstOther = fmt.Errorf("round %d, shard %d, phase %d: %w", round, shard, phase, err)
		}
	}
	if reserved {
		l.reserved[key] = creating
	}
}

// TestShardOutage: one store over three clusters (one member each, two
// store instances on clients of their own) and an owner lease in every
// shard; 4 writers per shard place rows (reserve + commit) of their shard.
// The owner's home shard's cluster is killed (SIGKILL) while they run,
// until each of its writers was refused and the other shards acknowledged
// writes meanwhile; then it restarts, until its writers get through again
// (with AUTHORITY_SOAK set, 6 such outages, each of the next shard). It
// prints
//
//	shard-outage: shards=3 outages=1 down-shards=[…] acked=… others-acked-during-outage=… down-failed=… (unavailable=… unknown=…, in flight at the kill …) others-failed=0 lost=0
//
// and requires that no write of another shard failed, nor one of the down
// shard after its restart; that the down shard's writes failed typed:
// ErrUnavailable for those its store refused before sending (at least one
// each outage), ErrOutcomeUnknown for those in flight at the kill or sent
// before the store saw the connection break (a write waiting for a
// connection that never comes cannot tell); that the owner's lease
// survived; and that every acknowledged row reads back after the restarts
// (a merged listing through a new store instance).
func TestShardOutage(t *testing.T) {
	clusters := startShardClusters(t, etcdcluster.Options{}, 1, 1, 1)
	const ns = "/faults/shard-outage/"
	stores := []*sharded.Store{openShardedNoPolicy(t, clusters, ns, outageWriteTimeout), openShardedNoPolicy(t, clusters, ns, outageWriteTimeout)}
	lease, err := stores[0].Registry().Acquire(settle(t), conformance.NodeA, conformance.NodeLifecycle, "outage-owner", ownerTTL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lease.Close(context.Background()) })
	tgt := conformance.Target(conformance.NodeA, conformance.NodeLifecycle, lease.Token())
	rounds := 1
	if soak() {
		rounds = outageSoakRounds
	}
	downs := make([]int, rounds)
	for r := range downs {
		downs[r] = (stores[0].OwnerHome("outage-owner") + r) % outageShards
	}

	led := &outageLedger{counts: make([][outageShards][phaseCount]outageCounts, rounds),
		acked: map[authority.Key]string{}, reserved: map[authority.Key]string{}}
	var stage atomic.Int32 // round × phaseCount + phase
	var stop atomic.Bool
	var wg sync.WaitGroup
	for shard := range outageShards {
		for w := range outageWritersPerShard {
			st := stores[w%len(stores)]
			wg.Go(func() { outageWriter(st, tgt, shard, w, &stage, &stop, led) })
		}
	}
	defer func() { stop.Store(true); wg.Wait() }()
	var outage time.Duration
	for r, down := range downs {
		outage += outageRound(t, clusters[down], led, &stage, r, down)
	}
	stop.Store(true)
	wg.Wait()

	select {
	case <-lease.Done():
		t.Error("the owner's lease ended during an outage")
	default:
	}
	lost := requireReadBack(t, openShardedNoPolicy(t, clusters, ns, outageWriteTimeout), led)
	reportOutage(t, led, downs, outage, lost)
}

// outageRound runs round r: every shard acknowledges writes; down's cluster
// is killed until its writers were refused and the others acknowledged
// writes; it restarts until writes of every shard get through again. It
// returns how long the cluster was down.
func outageRound(t *testing.T, c *etcdcluster.Cluster, led *outageLedger, stage *atomic.Int32, r, down int) time.Duration {
	t.Helper()
	acked := func(s, p int) int { return led.count(r, s, p, func(c *outageCounts) int { return c.acked }) }
	every := func(f func(shard int) bool) bool {
		for s := range outageShards {
			if !f(s) {
				return false
			}
		}
		return true
	}
	stage.Store(int32(r*phaseCount + phaseBefore))
	waitOutcome(t, "every shard acknowledged writes", led, func() bool {
		return every(func(s int) bool { return acked(s, phaseBefore) >= 5 })
	})
	if err := c.Kill(0); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	stage.Store(int32(r*phaseCount + phaseOutage)) // a write started before was in flight at the kill, or may have been
	waitOutcome(t, "the down shard's writers refused and the others' acknowledged", led, func() bool {
		refused := led.count(r, down, phaseOutage, func(c *outageCounts) int { return c.unavailable + c.unknown + c.other })
		return refused >= outageWritersPerShard && every(func(s int) bool { return s == down || acked(s, phaseOutage) >= 20 })
	})
	if err := c.Restart(0); err != nil {
		t.Fatal(err)
	}
	waitHealthy(t, c)
	outage := time.Since(killed)
	stage.Store(int32(r*phaseCount + phaseAfter))
	waitOutcome(t, "writes of every shard acknowledged after the restart", led, func() bool {
		return every(func(s int) bool { return acked(s, phaseAfter) >= 10 })
	})
	return outage
}

// waitOutcome waits until done holds, failing t after outageBound or on a
// write that failed unexpectedly.
func waitOutcome(t *testing.T, what string, led *outageLedger, done func() bool) {
	t.Helper()
	deadline := time.Now().Add(outageBound)
	for !done() {
		if time.Now().After(deadline) {
			t.Fatalf("not reached within %v: %s (counts %+v)", outageBound, what, led.snapshot())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (l *outageLedger) snapshot() [][outageShards][phaseCount]outageCounts {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.counts)
}

// outageWriter places rows of shard (reserve + commit, no retry) on tgt
// until stop, filing each outcome under the stage it started in.
func outageWriter(st *sharded.Store, tgt authority.CreationTarget, shard, w int, stage *atomic.Int32, stop *atomic.Bool, led *outageLedger) {
	for i := 0; !stop.Load(); i++ {
		id := fmt.Sprintf("s%d-w%d-%d", shard, w, i)
		key, err := authority.EncodeKey(authority.ObjectUserSpot, id)
		if err != nil || st.ShardOf(key) != shard {
			continue
		}
		at := int(stage.Load())
		reserved, err := reserveCommitOnce(st, tgt, id, id+"-creating", id+"-ready")
		led.record(at, shard, key, id+"-creating", id+"-ready", reserved, err)
	}
}

// reserveCommitOnce reserves and commits a User Spot, each call within
// outageWriteTimeout; reserved says the reservation was acknowledged.
func reserveCommitOnce(st *sharded.Store, tgt authority.CreationTarget, id, creating, ready string) (reserved bool, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), outageWriteTimeout)
	defer cancel()
	req := reserveRequest(authority.ObjectUserSpot, id, tgt, creating)
	res, err := st.Reserve(ctx, req)
	if err != nil {
		return false, err
	}
	if res.Kind != authority.KindReserved {
		return false, fmt.Errorf("reserve %s: %s", id, res.Kind)
	}
	cctx, ccancel := context.WithTimeout(context.Background(), outageWriteTimeout)
	defer ccancel()
	c, err := st.Commit(cctx, reservation{req: req, id: res.ReservationID, row: res.Creating}.commit(ready))
	if err != nil {
		return true, err
	}
	if c.Kind != authority.KindCommitted {
		return true, fmt.Errorf("commit %s: %s", id, c.Kind)
	}
	return true, nil
}

// requireReadBack lists every row through st and counts the acknowledged
// rows missing or not as acknowledged: an acknowledged commit must read
// active with its ready payload, an acknowledged reservation whose commit
// failed must read reserved with its creating payload or (the commit's
// outcome unknown) active with its ready payload.
func requireReadBack(t *testing.T, st *sharded.Store, led *outageLedger) (lost int) {
	t.Helper()
	rows := listSharded(t, st, "user_spot/")
	for key, ready := range led.acked {
		row := rows[key]
		if row == nil || row.Allocation.State != authority.AllocationActive || string(row.Payload) != ready {
			lost++
			t.Errorf("acknowledged row %s reads back as %+v", key, row)
		}
	}
	for key, creating := range led.reserved {
		row := rows[key]
		ok := row != nil && (string(row.Payload) == creating && row.Allocation.State == authority.AllocationReserved ||
			strings.HasSuffix(string(row.Payload), "-ready") && row.Allocation.State == authority.AllocationActive)
		if !ok {
			lost++
			t.Errorf("acknowledged reservation %s reads back as %+v", key, row)
		}
	}
	return lost
}

// reportOutage prints the figure line and checks the outcomes.
func reportOutage(t *testing.T, led *outageLedger, downs []int, outage time.Duration, lost int) {
	t.Helper()
	var acked, othersDuring, othersFailed, recoveredFailed, downFailed, downUnavailable, downUnknown, inFlight int
	for r, down := range downs {
		refused := 0
		for s := range outageShards {
			for p := range phaseCount {
				c := led.counts[r][s][p]
				failed := c.unavailable + c.unknown + c.other
				acked += c.acked
				switch {
				case s != down:
					othersFailed += failed
					if p == phaseOutage {
						othersDuring += c.acked
					}
				case p == phaseAfter:
					recoveredFailed += failed
				default:
					downFailed += failed
					downUnavailable += c.unavailable
					downUnknown += c.unknown
					if p == phaseBefore {
						inFlight += failed
					} else {
						refused += c.unavailable
					}
				}
			}
			t.Logf("outage %d (shard %d down), shard %d: %+v", r, down, s, led.counts[r][s])
		}
		if refused == 0 {
			t.Errorf("outage %d: no write of the down shard %d was refused with ErrUnavailable", r, down)
		}
	}
	for _, e := range led.unknownErrs {
		t.Logf("unknown outcome: %s", e)
	}
	t.Logf("shard-outage: shards=%d outages=%d down-shards=%v outage-s=%.1f writers=%d acked=%d others-acked-during-outage=%d down-failed=%d (unavailable=%d unknown=%d, in flight at the kill %d) others-failed=%d lost=%d",
		outageShards, len(downs), downs, outage.Seconds(), outageShards*outageWritersPerShard, acked, othersDuring,
		downFailed, downUnavailable, downUnknown, inFlight, othersFailed, lost)
	if othersFailed != 0 || recoveredFailed != 0 {
		t.Errorf("%d writes of the shards that stayed up and %d of a restarted shard failed (first untyped: %v)", othersFailed, recoveredFailed, led.firstOther)
	}
	if led.firstOther != nil {
		t.Errorf("a write failed with an untyped error: %v", led.firstOther)
	}
	if othersDuring == 0 {
		t.Error("no write of another shard was acknowledged during an outage")
	}
}

// openShardedNoPolicy is openSharded with NoCapacityPolicy: the outage runs
// without a capacity policy, so its stores run no capacity escrow, whose
// ledgers live in each node's home shard (while that shard is down, a store
// with escrow on places on the node only until its slices run out:
// docs/design-etcd.md, "Capacity escrow across shards").
func openShardedNoPolicy(t testing.TB, clusters []*etcdcluster.Cluster, ns string, timeout time.Duration) *sharded.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
	defer cancel()
	cfg := shardedConfig(shardClients(t, clusters), ns, timeout)
	cfg.NoCapacityPolicy = true
	s, err := sharded.New(ctx, cfg)
	if err != nil {
		t.Fatalf("open sharded store: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}
