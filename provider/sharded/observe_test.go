package sharded_test

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/provider/sharded"
)

// TestMetricsAndTracesNameTheShard: every shard's metrics carry the label
// shard, and every span a shard's store makes the attribute
// authority.shard, so a shard's outage or load shows as that shard's.
func TestMetricsAndTracesNameTheShard(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	s := newStore(t, clusterCount, sharded.Config{Registerer: reg, TracerProvider: tp})
	fx := conformance.NewFixture(t, harnessFor(s, nil))
	ctx, root := tp.Tracer("test").Start(context.Background(), "request")
	readShard := map[string]bool{}
	for i := range clusterCount {
		key, id := keyInShard(t, s, i, "observed")
		fx.Active(authority.ObjectActor, id, conformance.TargetA)
		_, err := s.ReadAuthority(ctx, key)
		require.NoError(t, err)
		readShard[itoa(int64(i))] = true
	}
	root.End()

	families, err := reg.Gather()
	require.NoError(t, err)
	shards := map[string]bool{}
	for _, mf := range families {
		if mf.GetName() != "authority_operations_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "shard" {
					shards[l.GetValue()] = true
				}
			}
		}
	}
	require.Equal(t, map[string]bool{"0": true, "1": true, "2": true}, shards)

	spanShards := map[string]bool{}
	for _, span := range exp.GetSpans() {
		if span.Name != "authority.read" {
			continue
		}
		for _, kv := range span.Attributes {
			if string(kv.Key) == sharded.ShardAttribute {
				spanShards[kv.Value.Emit()] = true
			}
		}
	}
	require.Equal(t, readShard, spanShards, "read spans by shard")
}
