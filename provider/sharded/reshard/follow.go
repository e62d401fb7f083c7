package reshard

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"

	authority "github.com/zlink-systems/authority"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
)

// errRestart ends a follow whose source's revision was compacted away: its
// copy starts again (copying phase).
var errRestart = errors.New("reshard: a source's copy starts again")

// followTick is how often a follow reads its sources' revisions and asks
// their watches for progress.
const followTick = 200 * time.Millisecond

// saveEvery is how often a follow writes its progress in the job record.
const saveEvery = 2 * time.Second

// sourceBatch is one watch response of source i.
type sourceBatch struct {
	i   int
	b   etcdstore.MoveBatch
	err error
}

// follow applies every source's changes after the revision its copy holds
// (Sources[i].Applied), until stop, asked after each batch and each tick
// with the copy's lag (revisions summed over the sources), says to. A
// source whose watch was compacted is copied again (errRestart).
func (j *job) follow(ctx context.Context, stop func(lag int64) (bool, error)) error {
	fctx, cancel := context.WithCancel(ctx)
	in := make(chan sourceBatch)
	watches := make([]*etcdstore.MoveWatch, len(j.srcs))
	var wg sync.WaitGroup
	for i, s := range j.srcs {
		w := s.Moves().Watch(fctx, j.rec.Sources[i].Applied)
		watches[i] = w
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				b, err := w.Next(fctx)
				select {
				case in <- sourceBatch{i: i, b: b, err: err}:
				case <-fctx.Done():
					return
				}
				if err != nil {
					return
				}
			}
		}()
	}
	defer func() {
		cancel()
		for _, w := range watches {
			_ = w.Close()
		}
		wg.Wait()
	}()
	return j.followLoop(ctx, in, watches, stop)
}

func (j *job) followLoop(ctx context.Context, in <-chan sourceBatch, watches []*etcdstore.MoveWatch, stop func(int64) (bool, error)) error {
	tick := time.NewTicker(followTick)
	defer tick.Stop()
	revs := make([]int64, len(j.srcs))
	saved := time.Now()
	if err := j.readRevisions(ctx, revs, watches); err != nil {
		return err
	}
	for first := true; ; first = false {
		if !first {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case sb := <-in:
				if err := j.followed(ctx, drain(sb, in)); err != nil {
					return err
				}
			case <-tick.C:
				if err := j.readRevisions(ctx, revs, watches); err != nil {
					return err
				}
			}
		}
		lag := j.lagBehind(revs)
		done, err := stop(lag)
		if err != nil {
			return err
		}
		if done || time.Since(saved) > saveEvery {
			saved = time.Now()
			if err := j.save(ctx); err != nil {
				return err
			}
		}
		if done {
			return nil
		}
		j.report()
		if j.rec.Decision == schema.DecisionAbort {
			return errAbort
		}
	}
}

// errAbort ends a phase once an abort was decided.
var errAbort = errors.New("reshard: abort decided")

// maxDrained bounds the watch responses applied together.
const maxDrained = 64

// drain returns first and the responses waiting behind it (at most
// maxDrained in all), so that they are applied together: fewer, fuller
// Txns when the sources write fast.
func drain(first sourceBatch, in <-chan sourceBatch) []sourceBatch {
	out := []sourceBatch{first}
	for len(out) < maxDrained && first.err == nil {
		select {
		case sb := <-in:
			out = append(out, sb)
			if sb.err != nil {
				return out
			}
		default:
			return out
		}
	}
	return out
}

// followed applies watch responses of the sources, in each source's order:
// the last change of each key of a source wins.
func (j *job) followed(ctx context.Context, sbs []sourceBatch) error {
	byKey := make([]map[string]change, len(j.srcs))
	through := make([]int64, len(j.srcs))
	var failed *sourceBatch
	for k := range sbs {
		sb := &sbs[k]
		if sb.err != nil {
			failed = sb
			break
		}
		if byKey[sb.i] == nil {
			byKey[sb.i] = map[string]change{}
		}
		for _, ev := range sb.b.Events {
			if c, ok := j.moving(sb.i, ev.Kv, ev.Type == mvccpb.DELETE); ok {
				byKey[sb.i][c.rel] = c
			}
		}
		through[sb.i] = max(through[sb.i], sb.b.Through)
	}
	for i, m := range byKey {
		if m == nil {
			continue
		}
		cs := make([]change, 0, len(m))
		for _, rel := range sortedRels(m) {
			cs = append(cs, m[rel])
		}
		if err := j.apply(ctx, i, cs); err != nil {
			return err
		}
		st := &j.rec.Sources[i]
		st.Applied = max(st.Applied, through[i])
	}
	if failed == nil {
		return nil
	}
	if errors.Is(failed.err, authority.ErrFeedCompacted) {
		if err := j.restartSource(ctx, failed.i); err != nil {
			return err
		}
		return errRestart
	}
	return fmt.Errorf("following shard %d: %w", failed.i, failed.err)
}

// readRevisions reads each source's revision into revs, and asks the watch
// of every source the copy lags for progress.
func (j *job) readRevisions(ctx context.Context, revs []int64, watches []*etcdstore.MoveWatch) error {
	for i, s := range j.srcs {
		rev, err := s.Moves().Revision(ctx)
		if err != nil {
			return fmt.Errorf("shard %d: %w", i, err)
		}
		revs[i] = rev
		if j.rec.Sources[i].Applied < rev {
			_ = watches[i].RequestProgress(ctx)
		}
	}
	return nil
}

// lagBehind is how many revisions the copy lags its sources, summed.
func (j *job) lagBehind(revs []int64) int64 {
	var lag int64
	for i, r := range revs {
		lag += max(0, r-j.rec.Sources[i].Applied)
	}
	j.mu.Lock()
	j.lag = lag
	j.mu.Unlock()
	j.m.lagged(lag)
	return lag
}

// catchingUp follows the sources until the copy lags them by at most
// SwitchLag, every owner live in a source holds its lease in the new
// cluster (or LeaseWait passed), and no prepared aggregate of a moving row
// is left (or AggregateWait passed since the copy caught up).
func (j *job) catchingUp(ctx context.Context) error {
	j.at("catching up")
	leaseBy := time.Now().Add(j.cfg.LeaseWait)
	var caughtUp, checked time.Time
	leases, aggregates := false, false
	err := j.follow(ctx, func(lag int64) (bool, error) {
		if lag > j.cfg.SwitchLag {
			return false, nil
		}
		if caughtUp.IsZero() {
			caughtUp = time.Now()
		}
		if time.Since(checked) < followTick {
			return false, nil
		}
		checked = time.Now()
		if !leases {
			missing, err := j.missingLeases(ctx)
			if err != nil {
				return false, err
			}
			leases = len(missing) == 0 || time.Now().After(leaseBy)
			j.rec.Note = ""
			if len(missing) > 0 {
				j.rec.Note = "owner leases not yet in the new cluster: " + joinFirst(missing, 5)
			}
		}
		if leases && !aggregates {
			prepared, err := j.movingAggregates(ctx)
			if err != nil {
				return false, err
			}
			aggregates = countFences(prepared) == 0 || time.Since(caughtUp) > j.cfg.AggregateWait
		}
		return leases && aggregates, nil
	})
	switch {
	case errors.Is(err, errRestart):
		return j.next(ctx, schema.PhaseCopying)
	case errors.Is(err, errAbort):
		return nil
	case err != nil:
		return err
	}
	return j.next(ctx, schema.PhaseSwitching)
}
