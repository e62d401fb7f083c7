package observe

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	authority "github.com/zlink-systems/authority"
)

// spanRecorder returns an Observer tracing into an in-memory exporter.
func spanRecorder(t *testing.T) (*Observer, *tracetest.InMemoryExporter) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
	return New(Config{TracerProvider: tp}), exp
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
	o, exp := spanRecorder(t)
	ctx, op := o.Start(t.Context(), OpCompareExchange)
	o.Refused(ctx, CompareRowVersion)
	op.End(authority.KindConflict, nil)
	_, op = o.Start(t.Context(), OpReserve)
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
	require.Nil(t, op)
	op.End(authority.KindSnapshot, nil)
	o.Refused(ctx, CompareLimit)
	o.Metrics().TxnSent(1, 1, true, nil, false)
	o.Logger().Info("discarded")
}
