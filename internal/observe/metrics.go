package observe

import (
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are a store's Prometheus metrics. Every method is safe on a nil
// *Metrics and then does nothing.
type Metrics struct {
	operations     *prometheus.CounterVec
	operationErrs  *prometheus.CounterVec
	durations      *prometheus.HistogramVec
	failedCompares *prometheus.CounterVec

	txns            *prometheus.CounterVec
	txnOps          prometheus.Histogram
	txnBytes        prometheus.Histogram
	batchedWrites   prometheus.Histogram
	groupCommit     prometheus.Histogram
	retries         *prometheus.CounterVec
	unknownOutcomes prometheus.Counter

	leases          *leaseTracker
	keepAliveFails  prometheus.Counter
	leasesLost      prometheus.Counter
	usageWatches    prometheus.Gauge
	usageResyncs    prometheus.Counter
	usageLag        prometheus.Gauge
	rowCache        *prometheus.CounterVec
	relocationBytes *prometheus.CounterVec
	compactionsSeen prometheus.Counter
	noSpace         prometheus.Counter

	// fast holds the resolved children of operations and durations by
	// operation and outcome index, so a recorded operation neither hashes
	// its label values nor locks.
	fast [numOperations][len(outcomeNames)]atomic.Pointer[opChildren]
}

type opChildren struct {
	count    prometheus.Counter
	duration prometheus.Observer
}

// latencyBuckets cover 0.1 ms to about 13 s.
var latencyBuckets = prometheus.ExponentialBuckets(0.0001, 2, 18)

func newMetrics(reg prometheus.Registerer, log *slog.Logger) *Metrics {
	r := registrar{reg: reg, log: log}
	m := &Metrics{
		operations: r.counterVec("authority_operations_total",
			"Store operations by operation and outcome kind (error: see authority_operation_errors_total).", "operation", "outcome"),
		operationErrs: r.counterVec("authority_operation_errors_total",
			"Store operations that returned an error, by operation and error sentinel.", "operation", "error"),
		failedCompares: r.counterVec("authority_failed_compares_total",
			"Writes that conflicted or were refused, by the compare that did not hold.", "compare"),
		txns: r.counterVec("authority_etcd_txns_total",
			"etcd Txns sent, by result: succeeded (compares held), failed (a compare did not hold), error.", "result"),
		retries: r.counterVec("authority_etcd_retries_total",
			"Operations sent again after contention or a changed read, by operation.", "operation"),
		rowCache: r.counterVec("authority_etcd_row_cache_lookups_total",
			"Row cache lookups by result (hit, miss).", "result"),
		relocationBytes: r.counterVec("authority_relocation_blob_bytes_total",
			"Relocation blob bytes by direction (written, read).", "direction"),
	}
	m.durations = r.histogramVec("authority_operation_duration_seconds",
		"Store operation latency by operation.", latencyBuckets, "operation")
	m.txnOps = r.histogram("authority_etcd_txn_ops", "Operations per etcd Txn sent.", prometheus.ExponentialBuckets(1, 2, 12))
	m.txnBytes = r.histogram("authority_etcd_txn_request_bytes", "Request bytes per etcd Txn sent.", prometheus.ExponentialBuckets(64, 4, 10))
	m.batchedWrites = r.histogram("authority_etcd_batched_writes", "Writes merged into one etcd Txn by write batching.", prometheus.ExponentialBuckets(1, 2, 10))
	m.groupCommit = r.histogram("authority_etcd_group_commit_reservations", "Reservations decided together by one group commit.", prometheus.ExponentialBuckets(1, 2, 10))
	m.unknownOutcomes = r.counter("authority_etcd_unknown_outcomes_total", "etcd writes whose outcome is unknown (timed out or lost reply).")
	m.keepAliveFails = r.counter("authority_owner_lease_keepalive_failures_total", "Owner lease keep-alive attempts that failed.")
	m.leasesLost = r.counter("authority_owner_leases_lost_total", "Owner leases that ended before their holder closed them.")
	m.usageWatches = r.gauge("authority_usage_watches_active", "Capacity usage watches running.")
	m.usageResyncs = r.counter("authority_usage_watch_resyncs_total", "Capacity usage watches that re-read their node's entries (start, compaction, error).")
	m.usageLag = r.gauge("authority_usage_watch_lag_revisions", "How many revisions the slowest usage watch is behind the newest revision the store has seen.")
	m.compactionsSeen = r.counter("authority_etcd_compactions_seen_total", "Watches or listings that found their revision compacted.")
	m.noSpace = r.counter("authority_etcd_nospace_errors_total", "etcd requests answered NOSPACE (the cluster is over its backend quota).")
	m.leases = newLeaseTracker(r)
	m.zero()
	return m
}

// compares are the compare kinds, the label values of
// authority_failed_compares_total.
var compares = []Compare{CompareRowVersion, CompareOwnerLease, CompareCapacityEpoch, CompareAggregateRecord, CompareLimit, CompareReservation}

// zero makes every counter series of a known label value exist at 0, so a
// dashboard panel or an alert on a healthy store shows 0, not "No data":
// failed compares by kind, retries by operation, and operation errors by
// operation and sentinel.
func (m *Metrics) zero() {
	for _, c := range compares {
		m.failedCompares.WithLabelValues(string(c))
	}
	for op := range numOperations {
		m.retries.WithLabelValues(op.String())
		for _, s := range sentinels {
			m.operationErrs.WithLabelValues(op.String(), s.name)
		}
	}
}

// registrar registers collectors, reusing one already registered under the
// same name (two stores on one registry share their metrics); any other
// failure is logged and the collector stays unregistered.
type registrar struct {
	reg prometheus.Registerer
	log *slog.Logger
}

func register[C prometheus.Collector](r registrar, c C) C {
	if err := r.reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
		r.log.Warn("authority metrics not registered", "error", err)
	}
	return c
}

func (r registrar) counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return register(r, prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels))
}

func (r registrar) counter(name, help string) prometheus.Counter {
	return register(r, prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help}))
}

func (r registrar) gauge(name, help string) prometheus.Gauge {
	return register(r, prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help}))
}

func (r registrar) histogram(name, help string, buckets []float64) prometheus.Histogram {
	return register(r, prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}))
}

func (r registrar) histogramVec(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	return register(r, prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels))
}

// outcomeNames are the outcome label values recorded without a lookup:
// every result kind, "ok" (an operation without one) and "error".
var outcomeNames = [...]string{
	"ok", outcomeError, "conflict", "alreadyExists", "typeMismatch", "placementCapacityExhausted",
	"generationExhausted", "reserved", "committed", "alreadyCommitted", "stale", "created", "rejected",
	"failed", "alreadyCompleted", "aborted", "alreadyAborted", "prepared", "alreadyPrepared",
	"scanExpired", "page", "missing", "snapshot", "stored", "deleted", "found",
}

var outcomeIndex = func() map[string]int {
	m := make(map[string]int, len(outcomeNames))
	for i, n := range outcomeNames {
		m[n] = i
	}
	return m
}()

// operation records one finished operation.
func (m *Metrics) operation(op Operation, outcome, sentinel string, took time.Duration) {
	i, known := outcomeIndex[outcome]
	if op >= numOperations || !known {
		m.operations.WithLabelValues(op.String(), outcome).Inc()
		m.durations.WithLabelValues(op.String()).Observe(took.Seconds())
	} else {
		ch := m.fast[op][i].Load()
		if ch == nil {
			ch = &opChildren{
				count:    m.operations.WithLabelValues(op.String(), outcome),
				duration: m.durations.WithLabelValues(op.String()),
			}
			m.fast[op][i].Store(ch)
		}
		ch.count.Inc()
		ch.duration.Observe(took.Seconds())
	}
	if sentinel != "" {
		m.operationErrs.WithLabelValues(op.String(), sentinel).Inc()
	}
}
