package twophase_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
)

// finisher is what the other store instance does after the kill.
type finisher int

const (
	finishCommit finisher = iota // CommitAggregate of the fence
	finishAbort                  // AbortAggregate of the fence
	finishWrite                  // a CAS of a participant at its version before
	finishRead                   // a read of a participant
)

func (f finisher) String() string { return [...]string{"commit", "abort", "write", "read"}[f] }

// tally counts trials for the figure line.
type tally struct {
	trials, partial, committed, aborted, killed, finishedByOther, maxSteps int
}

func (y *tally) String() string {
	return fmt.Sprintf("trials=%d partial=%d committed=%d not-committed=%d killed=%d finished-by-other=%d steps=%d",
		y.trials, y.partial, y.committed, y.aborted, y.killed, y.finishedByOther, y.maxSteps)
}

// bench is the namespaces trials share: a setup instance (the other store
// instance, which finishes what the killed one leaves) and the stores of
// the instance the trials kill.
type bench struct {
	c      *cluster
	setup  *instance
	fx     *conformance.Fixture
	victim *instance
	n      int
}

func newBench(t *testing.T) *bench {
	h, c, in := newHarness(t, newRoundRobin(shardCount), false)
	return &bench{c: c, setup: in, fx: conformance.NewFixture(t, h), victim: c.instance(t, nil)}
}

// scenario makes a new scenario on the bench's namespaces.
func (b *bench) scenario(t *testing.T) *scenario {
	b.n++
	fx := conformance.NewFixture(t, b.fx.H) // this subtest's t
	return newScenarioIn(t, b.c, b.setup, fx, fmt.Sprintf("agg%d", b.n), shardCount)
}

// trial runs the aggregate of a new scenario through an instance killed at
// its at-th shard call (op: "commit" or "abort" after the prepare), then
// fin through the other instance, settles it and checks it all or
// nothing. It reports whether the kill happened.
func (b *bench) trial(t *testing.T, op string, mode killMode, at int, fin finisher, y *tally) bool {
	ctx := context.Background()
	sc := b.scenario(t)
	k := newKiller(mode, at)
	a := b.victim.with(k.wrap)
	res, err := sc.prepare(t, a)
	if err == nil {
		require.Equal(t, authority.KindPrepared, res.Kind)
		switch op {
		case "commit":
			_, err = a.coord.CommitAggregate(ctx, sc.req.Fence())
		default:
			_, err = a.coord.AbortAggregate(ctx, sc.req.Fence())
		}
	}
	y.maxSteps = max(y.maxSteps, k.steps)
	if !k.killed() {
		require.NoError(t, err, "a commit or abort nobody killed")
	}
	if rec := sc.record(t); k.killed() && (rec != nil && !rec.Finished || sc.locks(t) > 0) {
		y.finishedByOther++
	}
	after := b.finish(t, sc, fin)
	committed := sc.settle(t)
	if after != nil {
		after(committed)
	}
	y.trials++
	if sc.check(t, committed) {
		y.partial++
	}
	if committed {
		y.committed++
	} else {
		y.aborted++
	}
	if k.killed() {
		y.killed++
	}
	return k.killed()
}

// finish runs fin through the setup instance and returns the check of its
// answer against the settled outcome (nil: none).
func (b *bench) finish(t *testing.T, sc *scenario, fin finisher) func(committed bool) {
	ctx := context.Background()
	r := sc.keys[1]
	switch fin {
	case finishCommit:
		res, err := sc.setup.coord.CommitAggregate(ctx, sc.req.Fence())
		require.NoError(t, err)
		return func(committed bool) {
			ok := res.Kind == authority.KindCommitted || res.Kind == authority.KindAlreadyCommitted
			require.Equal(t, committed, ok, "commit answered %s", res.Kind)
		}
	case finishAbort:
		res, err := sc.setup.coord.AbortAggregate(ctx, sc.req.Fence())
		require.NoError(t, err)
		return func(committed bool) {
			if res.Kind == authority.KindAborted || res.Kind == authority.KindAlreadyAborted {
				require.False(t, committed, "abort answered %s", res.Kind)
			}
		}
	case finishWrite:
		res, err := sc.store().CompareExchangeAuthority(ctx, r, sc.before[r].StoreVersion, authority.Put([]byte("writer")))
		require.NoError(t, err)
		return func(committed bool) {
			// the write is ordered before the commit (which is then
			// stale) or after it (a conflict)
			require.Equal(t, committed, res.Kind == authority.KindConflict, "the write answered %s", res.Kind)
		}
	default:
		res, err := sc.store().ReadAuthority(ctx, r)
		require.NoError(t, err)
		return func(committed bool) {
			if string(res.Snapshot.Payload) == string(sc.payload(r)) {
				require.True(t, committed, "a read saw the aggregate's payload of an aggregate not committed")
			}
		}
	}
}

// TestCoordinatorKilledAtEveryStep kills the coordinator of a commit (and
// of an abort) of an aggregate over three shards at every call it makes to
// a shard — after the call reached etcd, before it, or by cancelling its
// context — and has another store instance commit, abort, write or read
// the aggregate's rows; settled, the aggregate is applied in all its rows
// or in none, with no lock left and its capacity where its outcome puts it.
func TestCoordinatorKilledAtEveryStep(t *testing.T) {
	b := newBench(t)
	var y tally
	for _, op := range []string{"commit", "abort"} {
		for _, mode := range []killMode{killAfter, killBefore, killCancel} {
			for at := 1; ; at++ {
				killed := false
				for _, fin := range []finisher{finishCommit, finishAbort, finishWrite, finishRead} {
					t.Run(fmt.Sprintf("%s/%s/%d/%s", op, mode, at, fin), func(t *testing.T) {
						killed = b.trial(t, op, mode, at, fin, &y) || killed
					})
				}
				if !killed || t.Failed() {
					break // past the last step
				}
			}
		}
	}
	require.Zero(t, y.partial)
	require.NotZero(t, y.committed)
	require.NotZero(t, y.aborted)
	fmt.Printf("aggregate-2pc: %s\n", &y)
}
