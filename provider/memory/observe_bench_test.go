package memory

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// BenchmarkObservability measures what metrics and tracing cost on the CAS
// benchmark, off and on, in one run (docs/performance.md).
//
//	go test -run='^$' -bench=BenchmarkObservability -count=5 ./provider/memory/
func BenchmarkObservability(b *testing.B) {
	traced := func(sampler sdktrace.Sampler) func(*Config) {
		return func(o *Config) {
			tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sampler), sdktrace.WithBatcher(tracetest.NewNoopExporter()))
			b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
			o.Registerer, o.TracerProvider = prometheus.NewRegistry(), tp
		}
	}
	modes := []struct {
		name string
		set  func(*Config)
	}{
		{"off", func(*Config) {}},
		{"metrics", func(o *Config) { o.Registerer = prometheus.NewRegistry() }},
		{"metrics+traces-1pct", traced(sdktrace.TraceIDRatioBased(0.01))},
		{"metrics+traces-all", traced(sdktrace.AlwaysSample())},
	}
	// what an operation's latency costs at least: the two clock reads
	b.Run("clock-pair", func(b *testing.B) {
		var d time.Duration
		for range b.N {
			start := time.Now()
			d += time.Since(start)
		}
		clockSink = d
	})
	for _, m := range modes {
		b.Run("cas/"+m.name, func(b *testing.B) {
			benchConfig = m.set
			defer func() { benchConfig = func(*Config) {} }()
			benchCAS(b)
		})
	}
}

var clockSink time.Duration
