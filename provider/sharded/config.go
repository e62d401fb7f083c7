package sharded

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	authority "github.com/zlink-systems/authority"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
)

// DefaultReconcileInterval is Config.ReconcileInterval's default.
const DefaultReconcileInterval = 5 * time.Minute

// Config configures New.
type Config struct {
	// Shards are the etcd clusters, in the shard map's order (a row's shard
	// is an index into it): each one etcd store's configuration, with its
	// own client settings (Client, or Endpoints with TLS files and
	// credentials), Namespace, server limits and timeouts. The settings
	// below apply to every shard: a shard's own Clock, CapacityPolicy,
	// IdentityClaims, ReadOnly, Role, Build, Registerer, TracerProvider,
	// Logger or CapacityEscrow is refused (ErrInvalidArgument). 1 to
	// schema.MaxShards.
	Shards []etcdstore.Config
	// Epoch is the shard map's epoch (default 1): a map is changed only by a
	// resharding, which moves it on (package reshard).
	Epoch int64
	// Spares are clusters a resharding may add to the map (each an etcd
	// configuration, checked as Shards are). A store follows a resharding
	// while it runs: when the map names a cluster that is not among Shards,
	// the store opens the spare that is that cluster and namespace. It also
	// opens on a map of a later epoch than Epoch whose first shards are
	// Shards and whose others are among Spares (a node restarted with the
	// configuration it had before the map grew). Without Spares a store
	// cannot follow its map onto a cluster it does not know: its operations
	// then fail with ErrUnavailable naming the cluster. A store over one
	// shard with Spares runs capacity escrow from New on (unless ReadOnly or
	// NoCapacityPolicy), so that it keeps its capacity policy across the
	// first growth (docs/deviations.md G10).
	Spares []etcdstore.Config

	// Clock is every shard's clock (default the wall clock).
	Clock authority.Clock
	// CapacityPolicy is the placement capacity policy (nil: every placement
	// fits), every shard's. Over several shards it holds across them by
	// capacity escrow (see the package comment), which assumes a policy
	// monotone on requested + reserved + active per counter.
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

	// NoCapacityPolicy declares that this store never takes a capacity
	// policy: over several shards (or one, with Spares) it then runs no
	// capacity escrow, and a
	// reservation is one Txn in its shard, as on one cluster without a
	// policy, instead of a group commit fenced on the node's budget slice
	// (BenchmarkShards: ≈ 2× the reserve+commit pairs a second over 3
	// shards). CapacityPolicy must be nil and SetCapacityPolicy refuses a
	// policy (ErrInvalidArgument). Stores of one namespace may differ in
	// it: one without a policy admits every placement, as on one cluster.
	NoCapacityPolicy bool

	// EscrowChunk is the capacity escrow's grant size over several shards
	// (escrow.Config.Chunk: a shard short of a node's budget asks for this
	// many times what waits; 0: escrow.DefaultChunk).
	EscrowChunk int64
	// ReconcileInterval is how often a store of several shards finishes the
	// budget transfers a mover left in flight (escrow.Mover.ReconcileAll,
	// also run once when New returns; 0: DefaultReconcileInterval; negative:
	// only at New).
	ReconcileInterval time.Duration
	// RefuseCrossShardAggregates makes PrepareAggregate refuse an aggregate
	// whose participants live in several shards (ErrCrossShardAggregate,
	// nothing written) instead of committing it with the two-phase
	// protocol. The store still commits, aborts and resolves the aggregates
	// across shards other stores prepared.
	RefuseCrossShardAggregates bool
}

// runsEscrow reports whether the store runs capacity escrow: a writing
// store that may take a capacity policy, over several shards, or over one
// shard when it can follow a resharding onto more (Spares), so that the
// capacity placed before the first growth is in its node's budget and the
// store follows the grown map with its policy (docs/deviations.md G10).
func (cfg *Config) runsEscrow() bool {
	return !cfg.ReadOnly && !cfg.NoCapacityPolicy && (len(cfg.Shards) > 1 || len(cfg.Spares) > 0)
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
	for i, sc := range append(append([]etcdstore.Config(nil), cfg.Shards...), cfg.Spares...) {
		for field, set := range map[string]bool{
			"Clock": sc.Clock != nil, "CapacityPolicy": sc.CapacityPolicy != nil, "IdentityClaims": sc.IdentityClaims != nil,
			"ReadOnly": sc.ReadOnly, "Role": sc.Role != "", "Build": sc.Build != "", "Registerer": sc.Registerer != nil,
			"TracerProvider": sc.TracerProvider != nil, "Logger": sc.Logger != nil, "CapacityEscrow": sc.CapacityEscrow != nil,
		} {
			if set {
				return authority.Invalid(fmt.Sprintf("Shard %d sets %s: set it in the sharded Config, which applies it to every shard.", i, field))
			}
		}
	}
	if cfg.NoCapacityPolicy && cfg.CapacityPolicy != nil {
		return authority.Invalid("NoCapacityPolicy is set, and so is CapacityPolicy: a store declared without a capacity policy takes none.")
	}
	if cfg.EscrowChunk < 0 {
		return authority.Invalid(fmt.Sprintf("EscrowChunk %d is below 0.", cfg.EscrowChunk))
	}
	if cfg.ReconcileInterval == 0 {
		cfg.ReconcileInterval = DefaultReconcileInterval
	}
	// one monotonic clock for every shard: an expiry one shard's operation
	// saw passed stays passed for the others whatever the clock does
	// (docs/deviations.md C18)
	cfg.Clock = authority.NewMonotonicClock(cfg.Clock)
	return nil
}

// shardConfig returns shard i's etcd configuration: its own, with the
// settings every shard shares.
func (cfg *Config) shardConfig(i int) etcdstore.Config { return cfg.storeConfig(cfg.Shards[i], i) }

// storeConfig returns sc with the settings every shard shares, labelled
// shard i: fenced on the shard map (etcd.Config.ShardMapFence), since a
// resharding may move the map under any shard.
func (cfg *Config) storeConfig(sc etcdstore.Config, i int) etcdstore.Config {
	sc.ShardMapFence = true
	sc.Clock, sc.IdentityClaims, sc.ReadOnly, sc.Role, sc.Build = cfg.Clock, cfg.IdentityClaims, cfg.ReadOnly, cfg.Role, cfg.Build
	sc.CapacityPolicy = cfg.CapacityPolicy
	sc.ShardMember = true // routing, escrow and row locks are this store's
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
