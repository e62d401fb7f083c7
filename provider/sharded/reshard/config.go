package reshard

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	authority "github.com/zlink-systems/authority"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
)

// Config configures a resharding.
type Config struct {
	// Shards are the clusters of the map in force, in its order (as a
	// sharded.Config's Shards), each an etcd configuration with its own
	// client settings and namespace.
	Shards []etcdstore.Config
	// Add is the cluster the move adds: its namespace must hold no map and
	// no row (a new cluster, or an empty namespace of one). For Status,
	// Pause and Abort it names the move's new cluster.
	Add etcdstore.Config

	// Mover names this process in the job's claim (default host:pid).
	Mover string
	// Batch is the most keys one copy Txn writes (default 128; at most half
	// the servers' --max-txn-ops, less the fences).
	Batch int
	// SwitchLag is how far behind its sources, in revisions summed over
	// them, the copy may be when the switch starts (default 2000): the
	// sources are frozen only once the copy is that close, so that the
	// rows that move are refused for as short a time as the last changes
	// take to apply.
	SwitchLag int64
	// LeaseWait bounds the wait, before the switch, for every owner live in
	// a source to hold its lease in the new cluster (default 30 s; each
	// store takes it when it sees the pending move). Owners still missing
	// then are named in the job's note, and their writes of moved rows fail
	// as an owner not live until their store takes the lease.
	LeaseWait time.Duration
	// AggregateWait bounds the wait, before the freeze, for prepared
	// aggregates with a participant that moves to be committed or aborted
	// by their coordinators (default 5 s); the switch aborts the ones left.
	AggregateWait time.Duration
	// RaiseLimit is the most revisions the job writes to raise the new
	// cluster's revision (default 50,000,000): a new cluster far behind its
	// sources is better created with its revision raised already
	// (docs/operations.md, "Adding a cluster").
	RaiseLimit int64
	// RaiseParallel is how many raise writes are in flight (default 32).
	RaiseParallel int
	// ClaimTTL is the lease of the job's claim (default 10 s): a job whose
	// process died is taken over that long after its last keep-alive.
	ClaimTTL time.Duration

	// Registerer receives the job's metrics (nil: none).
	Registerer prometheus.Registerer
	// Logger receives the job's steps (nil: none).
	Logger *slog.Logger
	// Progress is told the job's progress at every step and about once a
	// second while it copies (nil: not told).
	Progress func(Progress)
	// Step, when set, is called with each step's name before the step
	// (test hook: a test cancels the job's context at a step to kill it
	// there).
	Step func(step string)
}

// check fills the defaults and refuses a configuration the job cannot run.
func (cfg *Config) check() error {
	if len(cfg.Shards) < 1 {
		return authority.Invalid("A resharding needs the clusters of the map in force (Shards).")
	}
	if cfg.Add.Client == nil && len(cfg.Add.Endpoints) == 0 {
		return authority.Invalid("A resharding needs the cluster it adds (Add: a client or endpoints).")
	}
	if cfg.Mover == "" {
		host, _ := os.Hostname()
		cfg.Mover = fmt.Sprintf("%s:%d", host, os.Getpid())
	}
	if cfg.Batch <= 0 {
		cfg.Batch = 128
	}
	for _, sc := range append(append([]etcdstore.Config(nil), cfg.Shards...), cfg.Add) {
		ops := sc.MaxTxnOps
		if ops == 0 {
			ops = etcdstore.DefaultMaxTxnOps
		}
		cfg.Batch = max(1, min(cfg.Batch, ops/2-4))
	}
	defaults := []struct {
		d   *time.Duration
		def time.Duration
	}{{&cfg.LeaseWait, 30 * time.Second}, {&cfg.AggregateWait, 5 * time.Second}, {&cfg.ClaimTTL, 10 * time.Second}}
	for _, d := range defaults {
		if *d.d <= 0 {
			*d.d = d.def
		}
	}
	if cfg.SwitchLag <= 0 {
		cfg.SwitchLag = 2000
	}
	if cfg.RaiseLimit <= 0 {
		cfg.RaiseLimit = 50_000_000
	}
	if cfg.RaiseParallel <= 0 {
		cfg.RaiseParallel = 32
	}
	return nil
}

// storeConfig is a cluster's store configuration for the job: fenced on the
// shard map (the job aborts aggregates under a frozen map), announced as
// the job.
func storeConfig(sc etcdstore.Config) etcdstore.Config {
	sc.ShardMapFence = true
	// the job admits no placement; its ledger grants (budget.go) move
	// budget the sources return, which no policy is asked about
	sc.CapacityPolicy, sc.CapacityEscrow = nil, nil
	if sc.Role == "" {
		sc.Role = "reshard"
	}
	return sc
}
