package observe

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	authority "github.com/zlink-systems/authority"
)

// Config is what a store was given to report through; each field may be
// nil.
type Config struct {
	Registerer     prometheus.Registerer
	TracerProvider trace.TracerProvider
	Logger         *slog.Logger
}

// Observer records a store's operations. A nil *Observer records nothing.
type Observer struct {
	metrics *Metrics
	tracer  trace.Tracer
	log     *slog.Logger
}

// tracerName is the instrumentation scope of the stores' spans.
const tracerName = "github.com/zlink-systems/authority"

// New returns the Observer for cfg, or nil when cfg configures nothing.
// Metrics another store registered on the same Registerer are shared.
func New(cfg Config) *Observer {
	if cfg.Registerer == nil && cfg.TracerProvider == nil && cfg.Logger == nil {
		return nil
	}
	o := &Observer{log: cfg.Logger}
	if o.log == nil {
		o.log = slog.New(slog.DiscardHandler)
	}
	if cfg.Registerer != nil {
		o.metrics = newMetrics(cfg.Registerer, o.log)
	}
	if cfg.TracerProvider != nil {
		o.tracer = cfg.TracerProvider.Tracer(tracerName)
	}
	return o
}

// Logger returns the store's logger (a discarding one when none was
// configured or o is nil).
func (o *Observer) Logger() *slog.Logger {
	if o == nil {
		return slog.New(slog.DiscardHandler)
	}
	return o.log
}

// Metrics returns the metrics (nil when none are registered).
func (o *Observer) Metrics() *Metrics {
	if o == nil {
		return nil
	}
	return o.metrics
}

// Op is one operation in progress; End it once. The zero Op records
// nothing.
type Op struct {
	o     *Observer
	op    Operation
	start time.Time
	span  trace.Span
}

// Start begins operation op: End records its outcome. When ctx carries a
// recording span (the caller traces this request), the operation gets a
// child span, carried by the returned context; the store never starts a
// trace of its own, so an untraced call costs no span. On a nil Observer it
// returns ctx and the zero Op.
func (o *Observer) Start(ctx context.Context, op Operation) (context.Context, Op) {
	if o == nil {
		return ctx, Op{}
	}
	p := Op{o: o, op: op}
	if o.metrics != nil {
		p.start = time.Now()
	}
	if o.tracer != nil && trace.SpanFromContext(ctx).IsRecording() {
		ctx, p.span = o.tracer.Start(ctx, "authority."+op.String(), trace.WithSpanKind(trace.SpanKindInternal))
	}
	return ctx, p
}

// End records the operation's outcome: kind when err is nil, else the
// error's sentinel.
func (p Op) End(kind authority.ResultKind, err error) {
	if p.o == nil {
		return
	}
	outcome, sentinel := string(kind), ""
	if err != nil {
		outcome, sentinel = outcomeError, Sentinel(err)
	} else if outcome == "" {
		outcome = "ok"
	}
	if m := p.o.metrics; m != nil {
		m.operation(p.op, outcome, sentinel, time.Since(p.start))
	}
	if kind == authority.KindPlacementCapacityExhausted || kind == authority.KindGenerationExhausted {
		p.o.refused(p.span, CompareLimit)
	} else if errors.Is(err, authority.ErrLimitExceeded) {
		p.o.refused(p.span, CompareLimit)
		// a request the configured limits refuse: the operator's to fix
		p.o.log.Warn("operation refused by a store limit", "operation", p.op.String(), "error", err)
	}
	if p.span != nil {
		p.span.SetAttributes(attribute.String("authority.outcome", outcome))
		if err != nil {
			p.span.SetAttributes(attribute.String("authority.error", sentinel))
			p.span.SetStatus(codes.Error, err.Error())
		}
		p.span.End()
	}
}

// Sentinel names the exported sentinel err wraps (a bounded label value).
func Sentinel(err error) string {
	for _, s := range sentinels {
		if errors.Is(err, s.err) {
			return s.name
		}
	}
	switch {
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline_exceeded"
	}
	return "other"
}

// sentinels are checked in order: the most specific first (an outcome
// unknown error also wraps unavailable).
var sentinels = []struct {
	err  error
	name string
}{
	{authority.ErrOutcomeUnknown, "outcome_unknown"},
	{authority.ErrClosed, "closed"},
	{authority.ErrInvalidArgument, "invalid_argument"},
	{authority.ErrLimitExceeded, "limit_exceeded"},
	{authority.ErrAccessDenied, "access_denied"},
	{authority.ErrUnsupportedServer, "unsupported_server"},
	{authority.ErrCorrupt, "corrupt"},
	{authority.ErrUnavailable, "unavailable"},
}

// Refused notes on ctx's span, and in authority_failed_compares_total,
// which compare made a write conflict or be refused.
func (o *Observer) Refused(ctx context.Context, c Compare) {
	if o != nil {
		o.refused(trace.SpanFromContext(ctx), c)
	}
}

func (o *Observer) refused(span trace.Span, c Compare) {
	if m := o.metrics; m != nil {
		m.failedCompares.WithLabelValues(string(c)).Inc()
	}
	if span != nil && span.IsRecording() {
		span.SetAttributes(attribute.String("authority.failed_compare", string(c)))
	}
}

// RoundTrip starts a child span for one etcd round trip named name (an etcd
// RPC, e.g. "etcd.Txn"); end records its error. On a nil Observer, or one
// without tracing, it returns ctx and a no-op end.
func (o *Observer) RoundTrip(ctx context.Context, name string, ops int) (context.Context, func(error)) {
	if o == nil || o.tracer == nil || !trace.SpanFromContext(ctx).IsRecording() {
		return ctx, endNothing
	}
	ctx, span := o.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.Int("etcd.ops", ops)))
	return ctx, func(err error) {
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}

func endNothing(error) {}

// Explaining says whether a failed compare is worth explaining: the store
// then reads the compared keys once more to name the compare that did not
// hold (only when metrics or a recording span will show it).
func (o *Observer) Explaining(ctx context.Context) bool {
	return o != nil && (o.metrics != nil || trace.SpanFromContext(ctx).IsRecording())
}
