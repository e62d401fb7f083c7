package faults_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// exerciseBound is how many times its planned run a scenario may keep going
// to exercise what it tests: on a loaded machine each operation is slower,
// so a fixed run can end before the scenario happened.
const exerciseBound = 10

// exerciseRun is a workload's run: it lasts at least the planned time, then
// until the scenario was exercised, and at most exerciseBound times the
// planned time.
type exerciseRun struct {
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	start   time.Time
	planned time.Duration
	took    atomic.Int64 // the run's length in ns once it ended exercised
}

// keepGoing starts a run of at least planned that ends once exercised
// reports true (checked every 50 ms after planned), or at the bound. Stop
// it with stop (deferred); after its workers returned, report whether it
// ended exercised and how long it ran.
func keepGoing(planned time.Duration, exercised func() bool) *exerciseRun {
	r := &exerciseRun{start: time.Now(), planned: planned}
	r.ctx, r.cancel = context.WithTimeout(context.Background(), exerciseBound*planned)
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		if !sleepCtx(r.ctx, planned) {
			return
		}
		for {
			if exercised() {
				r.took.Store(int64(time.Since(r.start)))
				r.cancel()
				return
			}
			if !sleepCtx(r.ctx, 50*time.Millisecond) {
				return
			}
		}
	}()
	return r
}

// stop ends the run and its watcher.
func (r *exerciseRun) stop() {
	r.cancel()
	r.wg.Wait()
}

// report returns whether the run ended exercised and how long it ran.
func (r *exerciseRun) report() (exercised bool, ran time.Duration) {
	if took := r.took.Load(); took > 0 {
		return true, time.Duration(took)
	}
	return false, time.Since(r.start)
}

// TestKeepGoing: a run lasts its planned time, then until its scenario was
// exercised; one whose scenario never happens ends at the bound, not
// exercised.
func TestKeepGoing(t *testing.T) {
	const planned = 100 * time.Millisecond
	var checks atomic.Int64
	r := keepGoing(planned, func() bool { return checks.Add(1) >= 4 })
	<-r.ctx.Done()
	r.stop()
	ok, ran := r.report()
	if !ok || ran < planned || checks.Load() != 4 {
		t.Errorf("exercised=%v after %v and %d checks; want it to keep going past %v until the 4th check", ok, ran, checks.Load(), planned)
	}

	never := keepGoing(planned, func() bool { return false })
	<-never.ctx.Done()
	never.stop()
	if ok, ran := never.report(); ok || ran < exerciseBound*planned {
		t.Errorf("exercised=%v after %v; want the run to end at the bound %v, not exercised", ok, ran, exerciseBound*planned)
	}
}
