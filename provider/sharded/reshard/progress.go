package reshard

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
)

// Progress is what a person watching a resharding sees: the job, its
// phase and current step, the rows moved, the rate, and how far the copy
// lags its sources.
type Progress struct {
	// Job is the job's ID; Phase its phase (schema.Phase*); Step what it
	// does now ("" when no process runs it).
	Job, Phase, Step string
	// FromEpoch and ToEpoch are the map in force's epoch and the next
	// map's; FromShards and ToShards their shard counts.
	FromEpoch, ToEpoch   int64
	FromShards, ToShards int
	// Rows and Keys count the rows and keys copied so far (a key copied
	// again after it changed counts again); Estimate is the rows expected
	// to move (the sources' rows over ToShards; 0: not counted).
	Rows, Keys, Estimate int64
	// Rate is the rows copied per second over the last seconds.
	Rate float64
	// Lag is how many revisions the copy lags its sources, summed (while
	// following them).
	Lag int64
	// Raised is how many revisions the job wrote to raise the new
	// cluster's revision.
	Raised int64
	// Paused, Decision and Note are the job record's.
	Paused   bool
	Decision string
	Note     string
	// Started and Updated are when the job began and last saved;
	// Switched when the next map came into force (zero before).
	Started, Updated, Switched time.Time
}

// String is a one-line summary.
func (p Progress) String() string {
	s := fmt.Sprintf("job %s %s: epoch %d→%d (%d→%d shards), %d rows (%d keys) copied", p.Job, p.Phase,
		p.FromEpoch, p.ToEpoch, p.FromShards, p.ToShards, p.Rows, p.Keys)
	if p.Estimate > 0 {
		s += fmt.Sprintf(" of about %d", p.Estimate)
	}
	if p.Rate > 0 {
		s += fmt.Sprintf(", %.0f rows/s", p.Rate)
	}
	if p.Lag > 0 {
		s += fmt.Sprintf(", lag %d revisions", p.Lag)
	}
	if p.Step != "" {
		s += "; " + p.Step
	}
	if p.Paused {
		s += " (paused)"
	}
	if p.Note != "" {
		s += "; " + p.Note
	}
	return s
}

func progressOf(r schema.ReshardJob, step string, lag, estimate int64, rate float64) Progress {
	p := Progress{Job: r.Move.Job, Phase: r.Phase, Step: step, FromEpoch: r.Move.From.Epoch, ToEpoch: r.Move.To.Epoch,
		FromShards: len(r.Move.From.Shards), ToShards: len(r.Move.To.Shards), Estimate: estimate, Rate: rate, Lag: lag,
		Raised: r.Raised, Paused: r.Paused, Decision: r.Decision, Note: r.Note, Started: r.Started, Updated: r.Updated, Switched: r.Switched}
	for _, s := range r.Sources {
		p.Rows += s.Rows
		p.Keys += s.Keys
	}
	return p
}

// progress is the job's progress now.
func (j *job) progress() Progress {
	j.mu.Lock()
	defer j.mu.Unlock()
	return progressOf(j.rec, j.step, j.lag, j.rate.estimate, j.rate.perSecond())
}

func (j *job) setStep(step string) {
	j.mu.Lock()
	j.step = step
	j.mu.Unlock()
	j.report()
}

// report tells Config.Progress.
func (j *job) report() {
	if j.cfg.Progress != nil {
		j.cfg.Progress(j.progress())
	}
}

// Status reads the job's record in the new cluster and how far the copy
// lags each source, writing nothing (read-only stores).
func Status(ctx context.Context, cfg Config) (Progress, error) {
	if err := cfg.check(); err != nil {
		return Progress{}, err
	}
	dc := storeConfig(cfg.Add)
	dc.ReadOnly = true
	dst, err := etcdstore.New(ctx, dc)
	if err != nil {
		return Progress{}, err
	}
	defer func() { _ = dst.Close() }()
	k, err := dst.Moves().ReadMap(ctx)
	if err != nil {
		return Progress{}, err
	}
	if k.Job == nil {
		n, err := dst.Moves().Count(ctx, "")
		if err != nil {
			return Progress{}, err
		}
		return Progress{}, &NoJobError{Namespace: dst.Namespace(), Empty: n == 0}
	}
	p := progressOf(*k.Job, "", 0, 0, 0)
	if k.Mover != "" {
		p.Step = "run by " + k.Mover
	}
	if k.Job.Phase == schema.PhaseCatchUp || k.Job.Phase == schema.PhaseSwitching {
		p.Lag, err = lagOf(ctx, cfg, *k.Job)
	}
	return p, err
}

// lagOf reads each source's revision, read-only, and sums how far the
// job's copy lags them.
func lagOf(ctx context.Context, cfg Config, r schema.ReshardJob) (int64, error) {
	var lag int64
	var errs []error
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i, sc := range cfg.Shards {
		if i >= len(r.Sources) {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sc = storeConfig(sc)
			sc.ReadOnly = true
			s, err := etcdstore.New(ctx, sc)
			if err == nil {
				var rev int64
				rev, err = s.Moves().Revision(ctx)
				_ = s.Close()
				mu.Lock()
				lag += max(0, rev-r.Sources[i].Applied)
				mu.Unlock()
			}
			if err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("shard %d: %w", i, err))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return lag, errors.Join(errs...)
}

// NoJobError reports that the new cluster's namespace holds no resharding
// job (Empty: no key at all, a mistyped namespace perhaps). It matches
// ErrOtherMove.
type NoJobError struct {
	Namespace string
	Empty     bool
}

func (e *NoJobError) Error() string {
	if e.Empty {
		return fmt.Sprintf("the new cluster's namespace %s holds no keys at all: no resharding job", e.Namespace)
	}
	return fmt.Sprintf("the new cluster's namespace %s holds no resharding job", e.Namespace)
}

// Is makes a NoJobError match ErrOtherMove.
func (e *NoJobError) Is(target error) bool { return target == ErrOtherMove }

// rateMeter keeps the rows copied over the last seconds.
type rateMeter struct {
	estimate int64
	samples  []rateSample
}

type rateSample struct {
	at   time.Time
	rows int64
}

// rateWindow is the span the rate is measured over.
const rateWindow = 10 * time.Second

func (r *rateMeter) add(rows int64) {
	now := time.Now()
	r.samples = append(r.samples, rateSample{at: now, rows: rows})
	for len(r.samples) > 0 && now.Sub(r.samples[0].at) > rateWindow {
		r.samples = r.samples[1:]
	}
}

func (r *rateMeter) perSecond() float64 {
	if len(r.samples) < 2 {
		return 0
	}
	var rows int64
	for _, s := range r.samples[1:] {
		rows += s.rows
	}
	span := r.samples[len(r.samples)-1].at.Sub(r.samples[0].at).Seconds()
	if span <= 0 {
		return 0
	}
	return float64(rows) / span
}

// metrics are the job's Prometheus metrics (nil registerer: none).
type metrics struct {
	reg             prometheus.Registerer
	rows, keys      prometheus.Counter
	raisedRevisions prometheus.Counter
	aborted         prometheus.Counter
	lag, estimate   prometheus.Gauge
	phase           *prometheus.GaugeVec
	switchSeconds   prometheus.Gauge
	all             []prometheus.Collector
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{reg: reg,
		rows: prometheus.NewCounter(prometheus.CounterOpts{Name: "authority_reshard_rows_copied_total",
			Help: "Rows a resharding copied into the new cluster (a row copied again after it changed counts again)."}),
		keys: prometheus.NewCounter(prometheus.CounterOpts{Name: "authority_reshard_keys_copied_total",
			Help: "Keys (rows, owner index and capacity entries, terminals) a resharding wrote into the new cluster."}),
		raisedRevisions: prometheus.NewCounter(prometheus.CounterOpts{Name: "authority_reshard_raised_revisions_total",
			Help: "Revisions a resharding wrote to raise the new cluster's revision above its sources'."}),
		aborted: prometheus.NewCounter(prometheus.CounterOpts{Name: "authority_reshard_aggregates_aborted_total",
			Help: "Prepared aggregates of moving rows a resharding's switch aborted."}),
		lag: prometheus.NewGauge(prometheus.GaugeOpts{Name: "authority_reshard_lag_revisions",
			Help: "Revisions the resharding's copy lags its sources, summed."}),
		estimate: prometheus.NewGauge(prometheus.GaugeOpts{Name: "authority_reshard_rows_estimate",
			Help: "Rows the resharding expects to move."}),
		phase: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "authority_reshard_phase",
			Help: "1 for the resharding job's current phase."}, []string{"phase"}),
		switchSeconds: prometheus.NewGauge(prometheus.GaugeOpts{Name: "authority_reshard_switch_seconds",
			Help: "Seconds from the first source's freeze to the next map in force (the last switch)."}),
	}
	m.all = []prometheus.Collector{m.rows, m.keys, m.raisedRevisions, m.aborted, m.lag, m.estimate, m.phase, m.switchSeconds}
	if reg != nil {
		for _, c := range m.all {
			_ = reg.Register(c)
		}
	}
	return m
}

func (m *metrics) unregister() {
	if m.reg != nil {
		for _, c := range m.all {
			m.reg.Unregister(c)
		}
	}
}

func (m *metrics) copied(rows, keys int64) {
	m.rows.Add(float64(rows))
	m.keys.Add(float64(keys))
}

func (m *metrics) raised(n int64) { m.raisedRevisions.Add(float64(max(n, 0))) }

func (m *metrics) abortedAggregate() { m.aborted.Inc() }

func (m *metrics) lagged(lag int64) { m.lag.Set(float64(lag)) }

// record sets the phase and estimate gauges from the job.
func (m *metrics) record(j *job) {
	for _, p := range []string{schema.PhaseCopying, schema.PhaseCatchUp, schema.PhaseSwitching, schema.PhaseSwitched,
		schema.PhaseDone, schema.PhaseAborting, schema.PhaseAborted} {
		v := 0.0
		if p == j.rec.Phase {
			v = 1
		}
		m.phase.WithLabelValues(p).Set(v)
	}
	j.mu.Lock()
	m.estimate.Set(float64(j.rate.estimate))
	j.mu.Unlock()
}

// switched records how long the sources were frozen (since frozeAt, when
// this run froze them).
func (m *metrics) switched(frozeAt, at time.Time) {
	if !frozeAt.IsZero() {
		m.switchSeconds.Set(at.Sub(frozeAt).Seconds())
	}
}
