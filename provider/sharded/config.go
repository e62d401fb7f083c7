package sharded

import (
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	authority "github.com/zlink-systems/authority"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
)

// Config configures New.
type Config struct {
	// Shards are the etcd clusters, in the shard map's order (a row's shard
	// is an index into it): each one etcd store's configuration, with its
	// own client settings (Client, or Endpoints with TLS files and
	// credentials), Namespace, server limits and timeouts. The settings
	// below apply to every shard: a shard's own Clock, CapacityPolicy,
	// IdentityClaims, ReadOnly, Role, Build, Registerer, TracerProvider or
	// Logger is refused (ErrInvalidArgument). 1 to schema.MaxShards.
	Shards []etcdstore.Config
	// Epoch is the shard map's epoch (default 1): a map is changed only by a
	// resharding, which moves it on (issue 43).
	Epoch int64

	// Clock is every shard's clock (default the wall clock).
	Clock authority.Clock
	// CapacityPolicy is the placement capacity policy (nil: every placement
	// fits). Over several shards it needs Escrow (ErrCapacityNeedsEscrow).
	CapacityPolicy authority.CapacityPolicy
	// IdentityClaims reports keys claimed elsewhere (nil: none).
	IdentityClaims authority.IdentityClaims
	// ReadOnly opens every shard read-only (etcd.Config.ReadOnly): New
	// writes nothing, not even the shard map, and refuses a set of several
	// shards that has none.
	ReadOnly bool
	// Role and Build are what each shard's store announces (etcd.Config).
	Role, Build string

	// Registerer receives every shard's metrics, each series labelled
	// shard="<index>" (nil: none).
	Registerer prometheus.Registerer
	// TracerProvider makes the shards' spans, each with the attribute
	// authority.shard (nil: none).
	TracerProvider trace.TracerProvider
	// Logger receives the shards' events, each with the attribute shard
	// (nil: none).
	Logger *slog.Logger

	// Escrow makes a capacity policy exact across shards (package
	// provider/sharded/escrow); nil: a capacity policy needs one shard.
	Escrow CapacityEscrow
	// CrossShard commits aggregates whose participants live in several
	// shards (package provider/sharded/twophase); nil: such an aggregate is
	// refused (ErrCrossShardAggregate).
	CrossShard CrossShardAggregates
}

// check refuses a configuration New cannot open, before anything connects.
func (cfg *Config) check() error {
	if len(cfg.Shards) < 1 || len(cfg.Shards) > schema.MaxShards {
		return authority.Invalid(fmt.Sprintf("A sharded store needs 1 to %d shards, not %d.", schema.MaxShards, len(cfg.Shards)))
	}
	if cfg.Epoch == 0 {
		cfg.Epoch = 1
	}
	if cfg.Epoch < 1 {
		return authority.Invalid(fmt.Sprintf("Shard map epoch %d is below 1.", cfg.Epoch))
	}
	for i, sc := range cfg.Shards {
		for field, set := range map[string]bool{
			"Clock": sc.Clock != nil, "CapacityPolicy": sc.CapacityPolicy != nil, "IdentityClaims": sc.IdentityClaims != nil,
			"ReadOnly": sc.ReadOnly, "Role": sc.Role != "", "Build": sc.Build != "", "Registerer": sc.Registerer != nil,
			"TracerProvider": sc.TracerProvider != nil, "Logger": sc.Logger != nil,
		} {
			if set {
				return authority.Invalid(fmt.Sprintf("Shard %d sets %s: set it in the sharded Config, which applies it to every shard.", i, field))
			}
		}
	}
	if cfg.CapacityPolicy != nil && len(cfg.Shards) > 1 && cfg.Escrow == nil {
		return capacityNeedsEscrow(len(cfg.Shards))
	}
	// one monotonic clock for every shard: an expiry one shard's operation
	// saw passed stays passed for the others whatever the clock does
	// (docs/deviations.md C18)
	cfg.Clock = authority.NewMonotonicClock(cfg.Clock)
	return nil
}

func capacityNeedsEscrow(shards int) error {
	return authority.Wrap(authority.ErrInvalidArgument, fmt.Sprintf(
		"A capacity policy over %d shards would be checked per shard and could over-admit a node: it needs capacity escrow (Config.Escrow).", shards),
		ErrCapacityNeedsEscrow)
}

// shardConfig returns shard i's etcd configuration: its own, with the
// settings every shard shares.
func (cfg *Config) shardConfig(i int) etcdstore.Config {
	sc := cfg.Shards[i]
	sc.Clock, sc.IdentityClaims, sc.ReadOnly, sc.Role, sc.Build = cfg.Clock, cfg.IdentityClaims, cfg.ReadOnly, cfg.Role, cfg.Build
	if len(cfg.Shards) == 1 || cfg.Escrow != nil {
		sc.CapacityPolicy = cfg.CapacityPolicy
	}
	label := fmt.Sprint(i)
	if cfg.Registerer != nil {
		sc.Registerer = prometheus.WrapRegistererWith(prometheus.Labels{"shard": label}, cfg.Registerer)
	}
	if cfg.TracerProvider != nil {
		sc.TracerProvider = shardTracing(cfg.TracerProvider, i)
	}
	if cfg.Logger != nil {
		sc.Logger = cfg.Logger.With("shard", i)
	}
	return sc
}
