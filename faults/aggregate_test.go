package faults_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdcluster"
)

const (
	// aggregateTrials is the number of commitAggregate trials.
	aggregateTrials = 100
	// aggregateKillEvery: every this many trials the leader is killed while
	// the commit runs (a kill costs a member restart).
	aggregateKillEvery = 10
	// aggregateRows is the number of participants of each aggregate.
	aggregateRows = 4
)

// TestCommitAggregateRacingLeaderKill moves a group of rows between two
// owners with prepare + commitAggregate, 100 times; in every tenth trial the
// leader is killed while the commit runs. After each commit attempt every
// participant moved or none did (read as one snapshot), and a retried
// commit completes the move exactly once.
func TestCommitAggregateRacingLeaderKill(t *testing.T) {
	c, cli := startCluster(t, etcdcluster.Options{})
	// the kill and restart goroutines end before the cluster closes (a
	// cleanup registered later runs first), even when a trial fails
	var bg sync.WaitGroup
	t.Cleanup(bg.Wait)
	const ns = "/faults/aggregate/"
	st := newStore(t, cli, ns)
	owners := []authority.CreationTarget{
		conformance.Target(conformance.NodeA, conformance.NodeLifecycle, authority.OwnerToken{OwnerID: "agg-owner-a", LeaseGeneration: 1}),
		conformance.Target(conformance.NodeB, conformance.NodeLifecycle, authority.OwnerToken{OwnerID: "agg-owner-b", LeaseGeneration: 1}),
	}
	for _, o := range owners {
		markLive(t, st, o, ownerTTL)
	}
	perRow := conformance.Capacity(authority.ObjectUserSpot, conformance.DefaultStableType)
	var total authority.CapacityVector
	for i := range aggregateRows {
		id := fmt.Sprintf("agg-%d", i)
		r := mustReserve(t, st, reserveRequest(authority.ObjectUserSpot, id, owners[0], id+"-creating"))
		mustCommit(t, st, r, id+"-ready")
		var err error
		if total, err = authority.AddCapacity(total, perRow); err != nil {
			t.Fatal(err)
		}
	}
	const prefix = "user_spot/agg-"
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))

	var (
		partial, firstCommitted, firstFailed, failedApplied, retried, kills int
		restarting                                                          chan error // the member killed last, coming back
	)
	for trial := range aggregateTrials {
		from, to := owners[trial%2], owners[(trial+1)%2]
		rows := listAll(t, st, prefix)
		if len(rows) != aggregateRows {
			t.Fatalf("trial %d: %d rows, want %d", trial, len(rows), aggregateRows)
		}
		var parts []authority.AggregateParticipant
		for key, row := range rows {
			if row.Owner() != from.Owner {
				t.Fatalf("trial %d: %s is owned by %v, want %v", trial, key, row.Owner(), from.Owner)
			}
			parts = append(parts, conformance.Participant(key, row.StoreVersion, authority.TransitionNewOwner,
				[]byte(fmt.Sprintf("trial-%d-%s", trial, key))))
		}
		req := conformance.AggregateRequest("move", int64(trial+1), to, total, parts...)
		eventually(t, "prepare", func(ctx context.Context) error {
			res, err := st.PrepareAggregate(ctx, req)
			if err == nil && res.Kind != authority.KindPrepared && res.Kind != authority.KindAlreadyPrepared {
				t.Fatalf("trial %d: prepare: %s", trial, res.Kind)
			}
			return err
		})

		kill := trial%aggregateKillEvery == aggregateKillEvery-1
		killed := make(chan int, 1)
		if kill {
			if restarting != nil { // the previous victim must serve before the next kill
				if err := <-restarting; err != nil {
					t.Fatal(err)
				}
				restarting = nil
				waitHealthy(t, c)
			}
			leader, err := c.Leader(settle(t))
			if err != nil {
				t.Fatal(err)
			}
			delay := time.Duration(rng.IntN(4000)) * time.Microsecond
			bg.Go(func() {
				time.Sleep(delay)
				if err := c.Kill(leader); err != nil {
					t.Errorf("kill leader %d: %v", leader, err)
				}
				killed <- leader
			})
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*opTimeout)
		res, err := st.CommitAggregate(ctx, req.Fence())
		cancel()
		switch {
		case err == nil && res.Kind == authority.KindCommitted:
			firstCommitted++
		case err == nil:
			t.Fatalf("trial %d: commitAggregate: %s", trial, res.Kind)
		default:
			firstFailed++
		}
		if kill {
			victim := <-killed
			kills++
			restarting = make(chan error, 1)
			bg.Go(func() { restarting <- c.Restart(victim) })
		}

		// atomicity: one snapshot of every participant right after the commit
		moved := countMoved(listAll(t, st, prefix), to.Owner, trial)
		if moved != 0 && moved != aggregateRows {
			partial++
			t.Errorf("trial %d: %d of %d participants moved (commit err %v)", trial, moved, aggregateRows, err)
		}
		if err == nil && moved != aggregateRows {
			t.Errorf("trial %d: commitAggregate acknowledged but %d of %d participants moved", trial, moved, aggregateRows)
		}
		// finish the move: a retry commits it or reports it committed
		if err != nil {
			if moved == aggregateRows {
				failedApplied++
			}
			retried++
			eventually(t, "retry commitAggregate", func(ctx context.Context) error {
				res, err := st.CommitAggregate(ctx, req.Fence())
				if err == nil && res.Kind != authority.KindCommitted && res.Kind != authority.KindAlreadyCommitted {
					t.Fatalf("trial %d: retried commitAggregate: %s", trial, res.Kind)
				}
				return err
			})
			if moved = countMoved(listAll(t, st, prefix), to.Owner, trial); moved != aggregateRows {
				partial++
				t.Errorf("trial %d: after the retry %d of %d participants moved", trial, moved, aggregateRows)
			}
		}
		eventually(t, "re-commit", func(ctx context.Context) error {
			res, err := st.CommitAggregate(ctx, req.Fence())
			if err == nil && res.Kind != authority.KindAlreadyCommitted {
				t.Fatalf("trial %d: commitAggregate of a committed aggregate: %s", trial, res.Kind)
			}
			return err
		})
	}
	if restarting != nil {
		if err := <-restarting; err != nil {
			t.Fatal(err)
		}
		waitHealthy(t, c)
	}
	// capacity: every row is active on the last target, nothing left reserved
	last := owners[aggregateTrials%2]
	var usage authority.CapacityUsage
	eventually(t, "capacity usage", func(ctx context.Context) error {
		var err error
		usage, err = st.CapacityUsage(ctx, last.Descriptor(), last.NodeLifecycleGeneration, authority.ObjectUserSpot, conformance.DefaultStableType)
		return err
	})
	if usage.Active != aggregateRows || usage.Reserved != 0 {
		t.Errorf("capacity on the final target: active=%d reserved=%d, want %d and 0", usage.Active, usage.Reserved, aggregateRows)
	}
	t.Logf("aggregate-crash: trials=%d leader-kills=%d partial=%d first-committed=%d first-failed=%d (of which applied=%d) retried=%d",
		aggregateTrials, kills, partial, firstCommitted, firstFailed, failedApplied, retried)
}

// countMoved counts the rows owned by to that carry trial's payload; it
// fails on a row owned by to with another payload.
func countMoved(rows map[authority.Key]*authority.Snapshot, to authority.OwnerToken, trial int) int {
	n := 0
	for key, row := range rows {
		if row.Owner() == to && string(row.Payload) == fmt.Sprintf("trial-%d-%s", trial, key) {
			n++
		}
	}
	return n
}
