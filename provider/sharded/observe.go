package sharded

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// ShardAttribute is the span attribute naming the shard (its index in the
// map) on every span a shard's store makes; metrics carry the label shard.
const ShardAttribute = "authority.shard"

// shardTracing returns tp with every span of its tracers carrying the shard.
func shardTracing(tp trace.TracerProvider, shard int) trace.TracerProvider {
	return shardTracerProvider{TracerProvider: tp, attr: attribute.Int(ShardAttribute, shard)}
}

type shardTracerProvider struct {
	trace.TracerProvider
	attr attribute.KeyValue
}

func (p shardTracerProvider) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	return shardTracer{Tracer: p.TracerProvider.Tracer(name, opts...), attr: p.attr}
}

type shardTracer struct {
	trace.Tracer
	attr attribute.KeyValue
}

func (t shardTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	return t.Tracer.Start(ctx, name, append(opts, trace.WithAttributes(t.attr))...)
}
