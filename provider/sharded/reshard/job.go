package reshard

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	authority "github.com/zlink-systems/authority"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/sharded"
)

// ErrOtherMove reports that the clusters hold another move than the one
// asked for: a move of other clusters pending, a job record of another
// move in the new cluster, or a switch already decided (Abort). Nothing was
// written.
var ErrOtherMove = errors.New("reshard: another move is in the way")

// ErrPaused reports that Run stopped because the job was paused (Pause);
// Resume runs it on.
var ErrPaused = errors.New("reshard: the job is paused")

// job is one run of a move's job by this process.
type job struct {
	cfg  Config
	srcs []*etcdstore.Store // the map in force's clusters, in order
	dst  *etcdstore.Store   // the cluster the move adds
	from schema.ShardMap    // the map in force when the run began
	m    *metrics

	claim  *etcdstore.MoveClaim
	rec    schema.ReshardJob
	recRev int64
	// dstRev is the new cluster's revision as the job last saw it.
	dstRev int64
	// frozeAt is when this run froze the first source.
	frozeAt time.Time

	mu       sync.Mutex // guards the progress fields below
	step     string
	lag      int64
	estimate int64
	rate     rateMeter
}

// open opens a store on every cluster of cfg (the map in force's, then the
// new one), and reads the map in force.
func open(ctx context.Context, cfg Config, readOnly bool) (*job, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	conf := func(sc etcdstore.Config) etcdstore.Config {
		sc = storeConfig(sc)
		sc.ReadOnly = readOnly
		return sc
	}
	var reg prometheus.Registerer
	if !readOnly {
		reg = cfg.Registerer
	}
	j := &job{cfg: cfg, srcs: make([]*etcdstore.Store, len(cfg.Shards)), m: newMetrics(reg)}
	errs := make([]error, len(cfg.Shards)+1)
	var wg sync.WaitGroup
	for i := range len(cfg.Shards) + 1 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i == len(cfg.Shards) {
				j.dst, errs[i] = etcdstore.New(ctx, conf(cfg.Add))
				return
			}
			j.srcs[i], errs[i] = etcdstore.New(ctx, conf(cfg.Shards[i]))
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		j.close()
		return nil, err
	}
	return j, nil
}

// close releases the claim and closes every store.
func (j *job) close() {
	if j.claim != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = j.claim.Release(ctx)
		cancel()
	}
	for _, s := range append(append([]*etcdstore.Store(nil), j.srcs...), j.dst) {
		if s != nil {
			_ = s.Close()
		}
	}
	j.m.unregister()
}

// ids returns each store's cluster (ID and namespace).
func (j *job) id(ctx context.Context, s *etcdstore.Store) (schema.ShardMapShard, error) {
	id, err := s.ClusterID(ctx)
	return schema.ShardMapShard{ClusterID: id, Namespace: s.Namespace()}, err
}

// mapInForce reads the sources' map keys and returns the map the move
// starts from: the configured clusters, at the epoch stored (for one source
// without a map, the one-shard map a single-cluster namespace is: epoch 1).
// A source whose map in force is already the move's next map (the switch
// happened, in this source at least) counts as holding the epoch before.
func (j *job) mapInForce(ctx context.Context) (schema.ShardMap, []etcdstore.MapKeys, error) {
	keys := make([]etcdstore.MapKeys, len(j.srcs))
	m := schema.ShardMap{Epoch: 1, Hash: sharded.HashName}
	for i, s := range j.srcs {
		k, err := s.Moves().ReadMap(ctx)
		if err != nil {
			return schema.ShardMap{}, nil, fmt.Errorf("shard %d: %w", i, err)
		}
		keys[i] = k
		id, err := j.id(ctx, s)
		if err != nil {
			return schema.ShardMap{}, nil, fmt.Errorf("shard %d: %w", i, err)
		}
		m.Shards = append(m.Shards, id)
	}
	epoch := int64(0)
	for i, k := range keys {
		if k.Current == nil {
			if len(j.srcs) == 1 {
				epoch = 1
				continue
			}
			return schema.ShardMap{}, nil, fmt.Errorf("%w: shard %d holds no shard map", sharded.ErrShardMapMismatch, i)
		}
		cur := *k.Current
		e := cur.Epoch
		if len(cur.Shards) == len(m.Shards)+1 {
			e-- // switched already: the move's next map
		}
		if cur.Hash != m.Hash || !extends(cur, m) || len(cur.Shards) > len(m.Shards)+1 || epoch != 0 && e != epoch {
			return schema.ShardMap{}, nil, fmt.Errorf("%w: shard %d holds map epoch %d of %d shards (%s): configure the clusters of the map in force, in its order",
				sharded.ErrShardMapMismatch, i, cur.Epoch, len(cur.Shards), cur.Diff(schema.ShardMap{Epoch: cur.Epoch, Hash: m.Hash, Shards: m.Shards}))
		}
		epoch = e
		if len(cur.Shards) == len(m.Shards) {
			m.HomeShards = cur.HomeShards // kept by every growth
		}
	}
	m.Epoch = epoch
	return m, keys, nil
}

// begin finds the move's job: the new cluster's record (its move must be
// from this map to the new cluster), or, when none, a new job for it.
func (j *job) begin(ctx context.Context, create bool) error {
	from, keys, err := j.mapInForce(ctx)
	if err != nil {
		return err
	}
	dk, err := j.dst.Moves().ReadMap(ctx)
	if err != nil {
		return fmt.Errorf("new cluster: %w", err)
	}
	dstID, err := j.id(ctx, j.dst)
	if err != nil {
		return err
	}
	if dk.Job != nil && (!create || dk.Job.Phase != schema.PhaseDone && dk.Job.Phase != schema.PhaseAborted) {
		mv := dk.Job.Move
		if mv.From.Diff(from) != "" {
			return fmt.Errorf("%w: the new cluster's job %s moves map epoch %d (%d shards), the clusters hold epoch %d (%d shards)",
				ErrOtherMove, mv.Job, mv.From.Epoch, len(mv.From.Shards), from.Epoch, len(from.Shards))
		}
		j.rec, j.recRev, j.from = *dk.Job, dk.JobRev, mv.From
		return nil
	}
	if !create {
		return fmt.Errorf("%w: the new cluster holds no resharding job in progress", ErrOtherMove)
	}
	rows, err := j.dst.Moves().Count(ctx, schema.SegRows+"/")
	if err != nil {
		return err
	}
	if dk.Current != nil || dk.Pending != nil || rows > 0 {
		return fmt.Errorf("%w: the new cluster's namespace %s holds a shard map, a pending move or rows (%d): a move adds an empty namespace",
			ErrOtherMove, j.dst.Namespace(), rows)
	}
	for i, k := range keys {
		if k.Pending != nil {
			return fmt.Errorf("%w: shard %d holds the pending move of job %s to cluster %s namespace %q", ErrOtherMove, i,
				k.Pending.Job, k.Pending.To.Shards[len(k.Pending.To.Shards)-1].ClusterID, k.Pending.To.Shards[len(k.Pending.To.Shards)-1].Namespace)
		}
	}
	to := from
	to.Epoch++
	to.Shards = append(append([]schema.ShardMapShard(nil), from.Shards...), dstID)
	to.HomeShards = from.NextHomes()
	mv := schema.ShardMove{Job: uuid.NewString(), From: from, To: to}
	if err := mv.Check(); err != nil {
		return authority.Wrap(authority.ErrInvalidArgument, "The new cluster cannot be added to the map", err)
	}
	now := time.Now().UTC()
	j.rec = schema.ReshardJob{Move: mv, Phase: schema.PhaseCopying, Sources: make([]schema.ReshardSource, len(from.Shards)), Started: now, Updated: now}
	j.recRev, j.from = dk.JobRev, from
	return nil
}

// extends reports whether grown is m with more shards after its own.
func extends(grown, m schema.ShardMap) bool {
	if len(grown.Shards) < len(m.Shards) {
		return false
	}
	for i, sh := range m.Shards {
		if grown.Shards[i] != sh {
			return false
		}
	}
	return true
}

// takeClaim takes the job's claim in the new cluster, waiting (up to twice
// the claim's TTL) for the claim of a process that died to end.
func (j *job) takeClaim(ctx context.Context) error {
	deadline := time.Now().Add(2*j.cfg.ClaimTTL + 5*time.Second)
	for {
		c, err := j.dst.Moves().Claim(ctx, j.cfg.Mover, j.cfg.ClaimTTL)
		if err == nil {
			j.claim = c
			return nil
		}
		if !errors.Is(err, etcdstore.ErrMoveConflict) || time.Now().After(deadline) {
			return err
		}
		j.setStep("waiting for the claim: " + err.Error())
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// save writes the job record (progress), fenced on the claim and on the
// record being as this run last wrote it. A record changed by another
// process (Pause, Abort) is read back: the error is ErrPaused when paused,
// nil when an abort was decided (the run turns to it), ErrOtherMove else.
func (j *job) save(ctx context.Context) error {
	j.rec.Updated = time.Now().UTC()
	rev, k, err := j.dst.Moves().PutJob(ctx, j.claim, j.rec, j.recRev)
	if err == nil {
		j.recRev = rev
		j.m.record(j)
		return nil
	}
	if !errors.Is(err, etcdstore.ErrMoveConflict) || k.Job == nil || k.Job.Move.Job != j.rec.Move.Job {
		return err
	}
	select {
	case <-j.claim.Done():
		return fmt.Errorf("%w: the job's claim ended", ErrOtherMove)
	default:
	}
	// another process edited the record: keep its pause or abort, and our
	// progress
	other := *k.Job
	j.recRev = k.JobRev
	j.rec.Paused = other.Paused
	if other.Decision != "" {
		j.rec.Decision = other.Decision
	}
	if err := j.save(ctx); err != nil {
		return err
	}
	if j.rec.Paused && j.rec.Decision != schema.DecisionAbort {
		return ErrPaused
	}
	return nil
}

// at runs the step hook and records the step.
func (j *job) at(step string) {
	j.setStep(step)
	if j.cfg.Logger != nil {
		j.cfg.Logger.Info("resharding", "job", j.rec.Move.Job, "step", step)
	}
	if j.cfg.Step != nil {
		j.cfg.Step(step)
	}
}

// checkpoint ends the run at a step boundary when the job was paused, or
// turns it to the abort.
func (j *job) checkpoint(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	k, err := j.dst.Moves().ReadMap(ctx)
	if err != nil {
		return err
	}
	if k.Job == nil || k.Job.Move.Job != j.rec.Move.Job || k.JobRev != j.recRev {
		return j.save(ctx)
	}
	return nil
}
