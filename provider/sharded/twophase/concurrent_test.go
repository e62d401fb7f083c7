package twophase_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
)

// concurrentTrials is how many trials TestConcurrentCommitsWritersAndKills
// runs.
const concurrentTrials = 200

// TestConcurrentCommitsWritersAndKills runs, for each trial, a prepared
// aggregate over three shards through two coordinators at once — one
// killed at a random step in a random way, or not at all; the other commits
// or, one time in four, aborts — beside a writer
// of one participant (a CAS at its version before the aggregate) and a
// reader of another. Settled, each trial is all or nothing and every answer
// agrees with the outcome: a commit that answered committed, a write that
// found a conflict, a read that saw the aggregate's payload all mean
// committed; a write that stored, an abort that answered aborted mean not
// committed.
func TestConcurrentCommitsWritersAndKills(t *testing.T) {
	b := newBench(t)
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("TWOPHASE_SEED"); v != "" { // to run a failed trial again
		n, err := strconv.ParseUint(v, 10, 64)
		require.NoError(t, err)
		seed = n
	}
	t.Logf("seed %d (TWOPHASE_SEED runs it again)", seed)
	rng := rand.New(rand.NewPCG(seed, seed>>7))
	var y tally
	unavailable := 0
	for i := range concurrentTrials {
		mode, at := killMode(rng.IntN(3)), rng.IntN(12) // at 0: not killed
		delays := [3]time.Duration{}
		for j := range delays {
			delays[j] = time.Duration(rng.IntN(4000)) * time.Microsecond
		}
		w, r := rng.IntN(3), rng.IntN(3)
		abort := rng.IntN(4) == 0 // the second coordinator aborts instead
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			if b.concurrentTrial(t, mode, at, delays, w, r, abort, &y) {
				unavailable++
			}
		})
		if t.Failed() {
			break
		}
	}
	require.Zero(t, y.partial)
	fmt.Printf("aggregate-2pc-concurrent: trials=%d partial=%d committed=%d not-committed=%d killed=%d gave-up=%d\n",
		y.trials, y.partial, y.committed, y.aborted, y.killed, unavailable)
}

// concurrentTrial is one trial of TestConcurrentCommitsWritersAndKills; it
// reports whether the unkilled coordinator gave up (ErrUnavailable).
func (b *bench) concurrentTrial(t *testing.T, mode killMode, at int, delays [3]time.Duration, w, r int, abort bool, y *tally) bool {
	ctx := context.Background()
	sc := b.scenario(t)
	res, err := sc.prepare(t, sc.setup)
	require.NoError(t, err)
	require.Equal(t, authority.KindPrepared, res.Kind)
	k := newKiller(mode, at)
	a := b.victim.with(k.wrap)
	var (
		wg          sync.WaitGroup
		aRes, bRes  authority.CommitAggregateResult
		aErr, bErr  error
		write, read = sc.keys[w], sc.keys[r]
		wRes        authority.CompareExchangeResult
		rRes        authority.ReadResult
		wErr, rErr  error
	)
	after := func(d time.Duration, fn func()) { wg.Go(func() { time.Sleep(d); fn() }) }
	after(0, func() { aRes, aErr = a.coord.CommitAggregate(ctx, sc.req.Fence()) })
	var abRes authority.AbortAggregateResult
	after(delays[0], func() {
		if abort {
			abRes, bErr = sc.setup.coord.AbortAggregate(ctx, sc.req.Fence())
			return
		}
		bRes, bErr = sc.setup.coord.CommitAggregate(ctx, sc.req.Fence())
	})
	after(delays[1], func() {
		wRes, wErr = sc.store().CompareExchangeAuthority(ctx, write, sc.before[write].StoreVersion, authority.Put([]byte("writer")))
	})
	after(delays[2], func() { rRes, rErr = sc.store().ReadAuthority(ctx, read) })
	wg.Wait()
	gaveUp := errors.Is(bErr, authority.ErrUnavailable) && !errors.Is(bErr, authority.ErrOutcomeUnknown)
	if !gaveUp {
		require.NoError(t, bErr)
	}
	require.NoError(t, wErr)
	require.NoError(t, rErr)
	if !k.killed() && at == 0 && !errors.Is(aErr, authority.ErrUnavailable) {
		require.NoError(t, aErr)
	}
	committed := sc.settle(t)
	for _, c := range []struct {
		res authority.CommitAggregateResult
		err error
	}{{aRes, aErr}, {bRes, bErr}} {
		if c.err == nil && (c.res.Kind == authority.KindCommitted || c.res.Kind == authority.KindAlreadyCommitted) {
			require.True(t, committed, "a commit answered %s", c.res.Kind)
		}
	}
	if bErr == nil && (abRes.Kind == authority.KindAborted || abRes.Kind == authority.KindAlreadyAborted) {
		require.False(t, committed, "an abort answered %s", abRes.Kind)
	}
	require.Equal(t, committed, wRes.Kind == authority.KindConflict, "the write answered %s", wRes.Kind)
	if string(rRes.Snapshot.Payload) == string(sc.payload(read)) {
		require.True(t, committed, "a read saw the payload of an aggregate not committed")
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
	return gaveUp
}
