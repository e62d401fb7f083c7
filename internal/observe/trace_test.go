package observe

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	authority "github.com/zlink-systems/authority"
)

// spanRecorder returns an Observer tracing into an in-memory exporter.
// It also returns a context carrying a recording root span: the store makes
// spans only inside a traced request.
func spanRecorder(t *testing.T) (*Observer, *tracetest.InMemoryExporter, context.Context) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ctx, root := tp.Tracer("test").Start(t.Context(), "request")
	t.Cleanup(func() { root.End() })
	return New(Config{TracerProvider: tp}), exp, ctx
}

func attr(s tracetest.SpanStub, key string) string {
	for _, kv := range s.Attributes {
		if kv.Key == attribute.Key(key) {
			return kv.Value.AsString()
		}
	}
	return ""
}

func TestSpanNamesOutcomeAndFailedCompare(t *testing.T) {
	o, exp, request := spanRecorder(t)
	ctx, op := o.Start(request, OpCompareExchange)
	o.Refused(ctx, CompareRowVersion)
	op.End(authority.KindConflict, nil)
	_, op = o.Start(request, OpReserve)
	op.End("", authority.ErrClosed)
	spans := exp.GetSpans()
	require.Len(t, spans, 2)
	require.Equal(t, "authority.compare_exchange", spans[0].Name)
	require.Equal(t, "conflict", attr(spans[0], "authority.outcome"))
	require.Equal(t, "row_version", attr(spans[0], "authority.failed_compare"))
	require.Equal(t, "error", attr(spans[1], "authority.outcome"))
	require.Equal(t, "closed", attr(spans[1], "authority.error"))
}

func TestNilObserverRecordsNothing(t *testing.T) {
	var o *Observer
	require.Nil(t, New(Config{}))
	ctx, op := o.Start(t.Context(), OpRead)
	require.Equal(t, t.Context(), ctx)
	require.Equal(t, Op{}, op)
	op.End(authority.KindSnapshot, nil)
	o.Refused(ctx, CompareLimit)
	o.Metrics().TxnSent(1, 1, true, nil, false)
	o.Logger().Info("discarded")
}

// TestNoSpanOutsideATrace: an operation called without a recording span in
// its context gets no span (the store starts no trace of its own).
func TestNoSpanOutsideATrace(t *testing.T) {
	o, exp, _ := spanRecorder(t)
	ctx, op := o.Start(t.Context(), OpRead)
	require.False(t, trace.SpanFromContext(ctx).IsRecording())
	op.End(authority.KindSnapshot, nil)
	require.Empty(t, exp.GetSpans())
}

// TestLimitRefusalIsLogged: a request a limit refuses is logged at Warn
// with its operation (an operator's configuration to fix).
func TestLimitRefusalIsLogged(t *testing.T) {
	var buf bytes.Buffer
	o := New(Config{Logger: slog.New(slog.NewJSONHandler(&buf, nil))})
	_, op := o.Start(t.Context(), OpPrepareAggregate)
	op.End("", fmt.Errorf("too big: %w", authority.ErrLimitExceeded))
	require.Contains(t, buf.String(), `"level":"WARN"`)
	require.Contains(t, buf.String(), `"operation":"prepare_aggregate"`)
	buf.Reset()
	_, op = o.Start(t.Context(), OpRead)
	op.End(authority.KindSnapshot, nil)
	require.Empty(t, buf.String(), "nothing is logged per operation")
}
