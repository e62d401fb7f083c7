// Package observe is the stores' instrumentation: Prometheus metrics,
// OpenTelemetry spans and slog events, shared by the memory and etcd
// providers so that both expose the same operation metrics under the same
// names.
//
// Everything is optional. A nil *Observer (no Registerer, TracerProvider or
// Logger configured) makes every method a nil check and nothing else; a
// configured one records only bounded labels — operation, outcome kind, error
// sentinel, compare kind — never a key, owner or node.
package observe
