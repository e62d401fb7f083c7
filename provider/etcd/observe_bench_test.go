package etcd_test

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
)

// benchObservability sets the observability of the stores benchStore makes
// (BenchmarkObservability switches it; every other benchmark runs without).
var benchObservability = func(*etcdstore.Config) {}

// BenchmarkObservability measures what metrics and tracing cost: the same
// workloads at 64 clients, off and on, in one run (docs/performance.md).
// Tracing samples every operation and exports in batches to a discarding
// exporter.
//
//	go test -run='^$' -bench=BenchmarkObservability -benchtime=3000x -count=3 ./provider/etcd/
func BenchmarkObservability(b *testing.B) {
	srv := etcdtest.Start(b, etcdtest.WithFsync(true))
	c := srv.Client(b)
	defer func() { benchObservability = func(*etcdstore.Config) {} }()
	modes := []struct {
		name string
		set  func(*etcdstore.Config)
	}{
		{"off", func(*etcdstore.Config) {}},
		{"metrics+traces", func(cfg *etcdstore.Config) {
			tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
			b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
			cfg.Registerer, cfg.TracerProvider = prometheus.NewRegistry(), tp
		}},
	}
	for _, w := range []struct {
		name string
		run  func(*testing.B, *clientv3.Client, int)
	}{{"cas", benchCAS}, {"reserve-commit", benchReserveCommit}} {
		for _, m := range modes {
			b.Run(w.name+"/clients=64/"+m.name, func(b *testing.B) {
				benchObservability = m.set
				w.run(b, c, 64)
			})
		}
	}
}
