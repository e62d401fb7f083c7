package reshard

import (
	"context"
	"errors"
	"fmt"

	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
)

// Run starts the move that adds cfg.Add to the map in force of cfg.Shards,
// or resumes the one the new cluster holds, and runs it to its end: the
// next map in force and the moved keys deleted from the sources
// (PhaseDone), or, once Abort decided it, the move undone (PhaseAborted).
// Killed at any step (its process, or ctx), Run again resumes from the
// job's record. A paused job is not run: ErrPaused (Resume runs it on).
func Run(ctx context.Context, cfg Config) (Progress, error) { return run(ctx, cfg, true) }

// Resume clears the job's pause and runs it as Run does.
func Resume(ctx context.Context, cfg Config) (Progress, error) {
	if _, err := edit(ctx, cfg, func(r *schema.ReshardJob) bool {
		was := r.Paused
		r.Paused = false
		return was
	}); err != nil {
		return Progress{}, err
	}
	return run(ctx, cfg, false)
}

// Pause asks the process running the job to stop at its next step (its
// progress stays in the record; Resume runs it on). A job whose switch is
// decided is not paused: the switch ends first.
func Pause(ctx context.Context, cfg Config) (Progress, error) {
	return edit(ctx, cfg, func(r *schema.ReshardJob) bool {
		if r.Paused || r.Decision != "" {
			return false
		}
		r.Paused = true
		return true
	})
}

// Abort decides to undo the move (unless its switch is decided already:
// ErrOtherMove) and runs the undoing: the pending move is deleted from
// every cluster, the sources unfrozen, the copies deleted from the new
// cluster; the map in force stays and nothing written through it is lost.
// If another process runs the job, Abort waits for its claim (that process
// turns to the abort at its next step and ends).
func Abort(ctx context.Context, cfg Config) (Progress, error) {
	decided := ""
	if _, err := edit(ctx, cfg, func(r *schema.ReshardJob) bool {
		decided = r.Decision
		if r.Decision != "" || r.Phase == schema.PhaseDone || r.Phase == schema.PhaseAborted {
			return false
		}
		r.Decision, r.Paused = schema.DecisionAbort, false
		return true
	}); err != nil {
		return Progress{}, err
	}
	if decided == schema.DecisionSwitch {
		return Status(ctx, cfg)
	}
	return run(ctx, cfg, false)
}

// edit changes the new cluster's job record without the claim.
func edit(ctx context.Context, cfg Config, change func(*schema.ReshardJob) bool) (Progress, error) {
	if err := cfg.check(); err != nil {
		return Progress{}, err
	}
	dst, err := etcdstore.New(ctx, storeConfig(cfg.Add))
	if err != nil {
		return Progress{}, err
	}
	defer func() { _ = dst.Close() }()
	rec, err := dst.Moves().EditJob(ctx, change)
	if errors.Is(err, etcdstore.ErrMoveConflict) {
		return Progress{}, fmt.Errorf("%w: %w", ErrOtherMove, err)
	}
	if err != nil {
		return Progress{}, err
	}
	if rec.Decision == schema.DecisionSwitch && rec.Phase != schema.PhaseDone {
		err = fmt.Errorf("%w: job %s decided its switch; it ends by switching", ErrOtherMove, rec.Move.Job)
	}
	return progressOf(rec, "", 0, 0, 0), err
}

// run opens the clusters, finds or creates the job, claims it and runs it.
func run(ctx context.Context, cfg Config, create bool) (Progress, error) {
	// checked on read-only stores first: a move refused writes nothing
	// (not even a store version into an empty namespace)
	ro, err := open(ctx, cfg, true)
	if err != nil {
		return Progress{}, err
	}
	err = ro.begin(ctx, create)
	ro.close()
	if err != nil {
		return Progress{}, err
	}
	j, err := open(ctx, cfg, false)
	if err != nil {
		return Progress{}, err
	}
	defer j.close()
	if err := j.begin(ctx, create); err != nil {
		return Progress{}, err
	}
	if j.finished() {
		return j.progress(), nil
	}
	if j.rec.Paused && j.rec.Decision == "" {
		return j.progress(), ErrPaused
	}
	if err := j.takeClaim(ctx); err != nil {
		return j.progress(), err
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-j.claim.Done():
			cancel()
		case <-rctx.Done():
		}
	}()
	err = j.loop(rctx)
	if err != nil && ctx.Err() == nil && rctx.Err() != nil {
		err = fmt.Errorf("%w: the job's claim ended (another process may run it)", ErrOtherMove)
	}
	return j.progress(), err
}

// finished reports a job with nothing left to do.
func (j *job) finished() bool {
	return j.rec.Phase == schema.PhaseDone || j.rec.Phase == schema.PhaseAborted
}

// loop runs the job's phases from the one its record is at.
func (j *job) loop(ctx context.Context) error {
	if j.recRev == 0 {
		if err := j.save(ctx); err != nil {
			return err
		}
	}
	j.report()
	for !j.finished() {
		if j.rec.Decision == schema.DecisionAbort {
			return j.abort(ctx)
		}
		var err error
		switch j.rec.Phase {
		case schema.PhaseCopying:
			err = j.copying(ctx)
		case schema.PhaseCatchUp:
			err = j.catchingUp(ctx)
		case schema.PhaseSwitching:
			err = j.switching(ctx)
		case schema.PhaseSwitched:
			err = j.cleanup(ctx)
		case schema.PhaseAborting:
			j.rec.Decision = schema.DecisionAbort
		}
		if err != nil {
			j.report()
			return err
		}
		j.report()
	}
	return nil
}

// next moves the job to phase and saves it.
func (j *job) next(ctx context.Context, phase string) error {
	j.rec.Phase, j.rec.Note = phase, ""
	return j.save(ctx)
}
