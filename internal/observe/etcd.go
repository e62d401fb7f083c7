package observe

// The etcd provider's own measurements. Each is safe on a nil *Metrics.

// TxnSent records one etcd Txn: its operation count, request bytes and
// result (succeeded: its compares held; failed: one did not; err: no
// answer, unknown outcome when unknown is set).
func (m *Metrics) TxnSent(ops, bytes int, succeeded bool, err error, unknown bool) {
	if m == nil {
		return
	}
	m.txnOps.Observe(float64(ops))
	m.txnBytes.Observe(float64(bytes))
	switch {
	case err != nil:
		m.txns.WithLabelValues("error").Inc()
		if unknown {
			m.unknownOutcomes.Inc()
		}
	case succeeded:
		m.txns.WithLabelValues("succeeded").Inc()
	default:
		m.txns.WithLabelValues("failed").Inc()
	}
}

// BatchedWrites records how many writes one batched Txn carried.
func (m *Metrics) BatchedWrites(n int) {
	if m != nil {
		m.batchedWrites.Observe(float64(n))
	}
}

// GroupCommit records how many reservations one group commit decided.
func (m *Metrics) GroupCommit(n int) {
	if m != nil {
		m.groupCommit.Observe(float64(n))
	}
}

// Retry records that op is sent again.
func (m *Metrics) Retry(op Operation) {
	if m != nil {
		m.retries.WithLabelValues(op.String()).Inc()
	}
}

// RowCache records a row cache lookup.
func (m *Metrics) RowCache(hit bool) {
	if m == nil {
		return
	}
	if hit {
		m.rowCache.WithLabelValues("hit").Inc()
	} else {
		m.rowCache.WithLabelValues("miss").Inc()
	}
}

// RelocationBytes records blob bytes written (or read when written is
// false).
func (m *Metrics) RelocationBytes(n int, written bool) {
	if m == nil {
		return
	}
	dir := "read"
	if written {
		dir = "written"
	}
	m.relocationBytes.WithLabelValues(dir).Add(float64(n))
}

// UsageWatchStarted and UsageWatchStopped count running usage watches.
func (m *Metrics) UsageWatchStarted() {
	if m != nil {
		m.usageWatches.Inc()
	}
}

// UsageWatchStopped counts a usage watch that ended.
func (m *Metrics) UsageWatchStopped() {
	if m != nil {
		m.usageWatches.Dec()
	}
}

// UsageResync counts a usage watch that re-read its node's entries.
func (m *Metrics) UsageResync() {
	if m != nil {
		m.usageResyncs.Inc()
	}
}

// UsageLag sets how many revisions the slowest usage watch is behind.
func (m *Metrics) UsageLag(revisions int64) {
	if m != nil {
		m.usageLag.Set(float64(revisions))
	}
}

// CompactionSeen counts a watch or listing that found its revision
// compacted.
func (m *Metrics) CompactionSeen() {
	if m != nil {
		m.compactionsSeen.Inc()
	}
}

// NoSpace counts a request etcd answered NOSPACE.
func (m *Metrics) NoSpace() {
	if m != nil {
		m.noSpace.Inc()
	}
}
