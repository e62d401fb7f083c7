package faults_test

import (
	"context"
	"errors"
	"fmt"
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

// The phases of the outage test; a write belongs to the phase it started in.
const (
	phaseBefore = iota // every cluster up
	phaseOutage        // the down shard's cluster killed
	phaseAfter         // restarted and healthy
	phaseCount
)

var phaseNames = [phaseCount]string{"before", "outage", "after"}

// outageCounts are the outcomes of the writes of one shard in one phase.
type outageCounts struct {
	acked, unavailable, unknown, other int
}

// outageLedger records what the writers were told.
type outageLedger struct {
	mu     sync.Mutex
	counts [outageShards][phaseCount]outageCounts
	// acked: rows whose reserve and commit were acknowledged (their ready
	// payload); reserved: rows whose reserve was acknowledged and whose
	// commit failed (their creating payload).
	acked, reserved map[authority.Key]string
	firstOther      error
	unknownErrs     []string
}

func (l *outageLedger) count(shard, phase int, f func(*outageCounts) int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return f(&l.counts[shard][phase])
}

// record files one write's outcome: err nil (acknowledged), or the error of
// its reserve (reserved false) or of its commit.
func (l *outageLedger) record(shard, phase int, key authority.Key, creating, ready string, reserved bool, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := &l.counts[shard][phase]
	switch {
	case err == nil:
		c.acked++
		l.acked[key] = ready
		return
	case errors.Is(err, authority.ErrUnavailable):
		c.unavailable++
	case errors.Is(err, authority.ErrOutcomeUnknown):
		c.unknown++
		l.unknownErrs = append(l.unknownErrs, fmt.Sprintf("shard %d, %s: %v", shard, phaseNames[phase], err))
	default:
		c.other++
		if l.firstOther == nil {
			l.firstOther = fmt.Errorf("shard %d, %s: %w", shard, phaseNames[phase], err)
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
// writes meanwhile; then it restarts, until its writers get through again.
// It prints
//
//	shard-outage: shards=3 down-shard=… acked=… others-acked-during-outage=… down-failed=… (unavailable=… unknown=…) others-failed=0 lost=0
//
// and requires that no write of another shard failed; that the down
// shard's writes failed typed: ErrUnavailable for those its store refused
// before sending (at least one), ErrOutcomeUnknown for those in flight at
// the kill or sent before the store saw the connection break (a write
// waiting for a connection that never comes cannot tell); that the owner's
// lease survived; and that every acknowledged row reads back after the
// restart (a merged listing through a new store instance).
func TestShardOutage(t *testing.T) {
	clusters := startShardClusters(t, etcdcluster.Options{}, 1, 1, 1)
	const ns = "/faults/shard-outage/"
	stores := []*sharded.Store{openSharded(t, clusters, ns, outageWriteTimeout), openSharded(t, clusters, ns, outageWriteTimeout)}
	lease, err := stores[0].Registry().Acquire(settle(t), conformance.NodeA, conformance.NodeLifecycle, "outage-owner", ownerTTL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lease.Close(context.Background()) })
	tgt := conformance.Target(conformance.NodeA, conformance.NodeLifecycle, lease.Token())
	down := stores[0].OwnerHome("outage-owner")

	led := &outageLedger{acked: map[authority.Key]string{}, reserved: map[authority.Key]string{}}
	var phase atomic.Int32
	var stop atomic.Bool
	var wg sync.WaitGroup
	for shard := range outageShards {
		for w := range outageWritersPerShard {
			st := stores[w%len(stores)]
			wg.Go(func() { outageWriter(st, tgt, shard, w, &phase, &stop, led) })
		}
	}
	defer func() { stop.Store(true); wg.Wait() }()

	others := func(f func(shard int) bool) bool {
		for s := range outageShards {
			if s != down && !f(s) {
				return false
			}
		}
		return true
	}
	acked := func(s, p int) int { return led.count(s, p, func(c *outageCounts) int { return c.acked }) }
	waitOutcome(t, "every shard acknowledged writes", led, func() bool {
		return acked(down, phaseBefore) >= 5 && others(func(s int) bool { return acked(s, phaseBefore) >= 5 })
	})

	if err := clusters[down].Kill(0); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	phase.Store(phaseOutage) // a write started before was in flight at the kill, or may have been
	waitOutcome(t, "the down shard's writers refused and the others' acknowledged", led, func() bool {
		refused := led.count(down, phaseOutage, func(c *outageCounts) int { return c.unavailable + c.unknown + c.other })
		return refused >= outageWritersPerShard && others(func(s int) bool { return acked(s, phaseOutage) >= 20 })
	})
	if err := clusters[down].Restart(0); err != nil {
		t.Fatal(err)
	}
	waitHealthy(t, clusters[down])
	outage := time.Since(killed)
	phase.Store(phaseAfter)
	waitOutcome(t, "writes of every shard acknowledged after the restart", led, func() bool {
		return acked(down, phaseAfter) >= 10 && others(func(s int) bool { return acked(s, phaseAfter) >= 10 })
	})
	stop.Store(true)
	wg.Wait()

	select {
	case <-lease.Done():
		t.Error("the owner's lease ended during the outage")
	default:
	}
	lost := requireReadBack(t, openSharded(t, clusters, ns, outageWriteTimeout), led)
	reportOutage(t, led, down, outage, lost)
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

func (l *outageLedger) snapshot() [outageShards][phaseCount]outageCounts {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.counts
}

// outageWriter places rows of shard (reserve + commit, no retry) on tgt
// until stop, filing each outcome under the phase it started in.
func outageWriter(st *sharded.Store, tgt authority.CreationTarget, shard, w int, phase *atomic.Int32, stop *atomic.Bool, led *outageLedger) {
	for i := 0; !stop.Load(); i++ {
		id := fmt.Sprintf("s%d-w%d-%d", shard, w, i)
		key, err := authority.EncodeKey(authority.ObjectUserSpot, id)
		if err != nil || st.ShardOf(key) != shard {
			continue
		}
		p := int(phase.Load())
		reserved, err := reserveCommitOnce(st, tgt, id, id+"-creating", id+"-ready")
		led.record(shard, p, key, id+"-creating", id+"-ready", reserved, err)
	}
}

// reserveCommitOnce reserves and commits a User Spot within
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
	c, err := st.Commit(ctx, reservation{req: req, id: res.ReservationID, row: res.Creating}.commit(ready))
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
func reportOutage(t *testing.T, led *outageLedger, down int, outage time.Duration, lost int) {
	t.Helper()
	var acked, othersDuring, othersFailed, downFailed, downUnavailable, downUnknown int
	for s := range outageShards {
		for p := range phaseCount {
			c := led.counts[s][p]
			acked += c.acked
			if s != down {
				othersFailed += c.unavailable + c.unknown + c.other
				if p == phaseOutage {
					othersDuring += c.acked
				}
				continue
			}
			downFailed += c.unavailable + c.unknown + c.other
			downUnavailable += c.unavailable
			downUnknown += c.unknown
		}
	}
	during := led.counts[down][phaseOutage]
	t.Logf("shard-outage: shards=%d down-shard=%d outage-s=%.1f writers=%d acked=%d others-acked-during-outage=%d down-failed=%d (unavailable=%d unknown=%d) others-failed=%d lost=%d",
		outageShards, down, outage.Seconds(), outageShards*outageWritersPerShard, acked, othersDuring, downFailed, downUnavailable, downUnknown, othersFailed, lost)
	for s := range outageShards {
		t.Logf("shard %d: %+v", s, led.counts[s])
	}
	for _, e := range led.unknownErrs {
		t.Logf("unknown outcome: %s", e)
	}
	if othersFailed != 0 {
		t.Errorf("%d writes of the shards that stayed up failed (first unexpected: %v)", othersFailed, led.firstOther)
	}
	if led.firstOther != nil {
		t.Errorf("a write failed with an untyped error: %v", led.firstOther)
	}
	if during.unavailable == 0 {
		t.Error("no write of the down shard was refused with ErrUnavailable during the outage")
	}
}
