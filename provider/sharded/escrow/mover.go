package escrow

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"

	authority "github.com/zlink-systems/authority"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
)

// Shard is what the mover needs of one shard: the fenced escrow steps of
// its store (etcdstore.BudgetSteps, from Store.Budget, implements it). A
// shard's slice steps act on that shard's slices; its ledger steps on the
// ledgers of the node lifecycles whose home it is.
type Shard interface {
	// Slice reads a node lifecycle's budget slice and usage in the shard.
	Slice(ctx context.Context, node authority.NodeDescriptor, lifecycle int64) (etcdstore.SliceState, error)
	// Receive applies the ledger's figure of what it gave the shard.
	Receive(ctx context.Context, node authority.NodeDescriptor, lifecycle int64, given schema.Budget) (schema.BudgetSlice, error)
	// Release gives the slice's slack back (fenced on the usage).
	Release(ctx context.Context, node authority.NodeDescriptor, lifecycle int64) (schema.BudgetSlice, error)
	// Ledger reads a node lifecycle's ledger.
	Ledger(ctx context.Context, node authority.NodeDescriptor, lifecycle int64) (schema.BudgetLedger, error)
	// Grant adds to shard's line the first ask the policy admits
	// (etcdstore.ErrBudgetExhausted when none).
	Grant(ctx context.Context, node authority.NodeDescriptor, lifecycle int64, shard int, asks ...authority.CapacityVector) (schema.BudgetLedger, error)
	// Credit records what shard's slice returned.
	Credit(ctx context.Context, node authority.NodeDescriptor, lifecycle int64, shard int, returned schema.Budget) (schema.BudgetLedger, error)
	// Ledgers lists the node lifecycles with a ledger in the shard.
	Ledgers(ctx context.Context) ([]etcdstore.NodeLifecycle, error)
}

var _ Shard = etcdstore.BudgetSteps{}

// DefaultChunk is Config.Chunk's default.
const DefaultChunk = 8

// Config configures New.
type Config struct {
	// Shards is the number of shards (1..65536), in the shard map's order:
	// shard i's line in a ledger is line i.
	Shards int
	// Home returns the shard that holds a node's ledgers (default
	// HomeShard over Shards). It must not change while the shards run,
	// also when AddShard grows them: a sharded store passes HomeShard over
	// its map's Homes(), which a resharding keeps.
	Home func(node authority.NodeDescriptor) int
	// Chunk: a grow first asks for Chunk times the waiting requests (then
	// less, down to what waits, when the policy refuses that much), so the
	// next ones find room in the slice without a cross-shard step (default
	// DefaultChunk; 1: only what waits).
	Chunk int64
	// Logger receives reclaims and recoveries (nil: none).
	Logger *slog.Logger
}

// Mover moves capacity budget between the shards of one namespace: the
// CapacityEscrow of every shard's store (Hook). It holds no state of its
// own beyond the shards it was given: every fact is in the ledgers and
// slices, so any number of movers (one per process) may run at once.
type Mover struct {
	cfg    Config
	mu     sync.RWMutex
	shards []Shard
	slow   reclaimQueues // one reclaim at a time per node lifecycle, per mover
	stats  struct{ grows, grants, exhausted, reclaims atomic.Int64 }
}

// New returns a mover over cfg.Shards shards, none attached yet.
func New(cfg Config) (*Mover, error) {
	if cfg.Shards < 1 || cfg.Shards > 1<<16 {
		return nil, authority.Invalid(fmt.Sprintf("escrow: %d shards is outside 1..65536.", cfg.Shards))
	}
	if cfg.Chunk == 0 {
		cfg.Chunk = DefaultChunk
	}
	if cfg.Chunk < 1 {
		return nil, authority.Invalid("escrow: Chunk must be at least 1.")
	}
	if cfg.Home == nil {
		n := cfg.Shards
		cfg.Home = func(node authority.NodeDescriptor) int { return HomeShard(node, n) }
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Mover{cfg: cfg, shards: make([]Shard, cfg.Shards), slow: reclaimQueues{m: map[string]*reclaimQueue{}}}, nil
}

// HomeOf is the home shard of a node's ledgers in a namespace whose map in
// force is m, which no resharding of it changes: HomeShard over m.Homes(),
// the home shard count a resharding keeps (1, so shard 0, in a namespace of
// one shard and in one that grew from one cluster). Cross-shard aggregate
// coordinator records use the same count (package provider/sharded).
func HomeOf(node authority.NodeDescriptor, m schema.ShardMap) int {
	return HomeShard(node, m.Homes())
}

// HomeShard is the default home of a node's ledgers: FNV-1a of its mesh
// name and RID, modulo shards.
func HomeShard(node authority.NodeDescriptor, shards int) int {
	h := fnv.New64a()
	_, _ = h.Write([]byte(node.MeshName))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(node.RID))
	return int(h.Sum64() % uint64(shards))
}

// Hook returns the CapacityEscrow to give shard i's store
// (etcdstore.Config.CapacityEscrow). It grows only once every shard is
// attached; before, Grow fails with ErrUnavailable.
func (m *Mover) Hook(i int) etcdstore.CapacityEscrow { return hook{m: m, shard: i} }

// Attach gives the mover shard i's steps (usually store.Budget()).
func (m *Mover) Attach(i int, sh Shard) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if i < 0 || i >= len(m.shards) || sh == nil {
		return authority.Invalid(fmt.Sprintf("escrow: cannot attach shard %d of %d.", i, len(m.shards)))
	}
	m.shards[i] = sh
	return nil
}

// AddShard grows the mover by shard i, attached to sh: the cluster a
// resharding appends to the shard map (package provider/sharded/reshard),
// whose store was opened with Hook(i). i must be the mover's shard count
// (the next index); adding the same sh at an index it already holds does
// nothing, so a caller may retry. Node homes stay where Config.Home puts
// them. A Grow, Reconcile or Reclaim that already took the shard list goes
// on with the shards it had; the next ones see the new shard. Safe next to
// running steps and other AddShard calls.
func (m *Mover) AddShard(i int, sh Shard) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case sh == nil || i < 0 || i > len(m.shards) || len(m.shards) >= 1<<16:
		return authority.Invalid(fmt.Sprintf("escrow: cannot add shard %d to %d shards.", i, len(m.shards)))
	case i < len(m.shards) && sameShard(m.shards[i], sh):
		return nil
	case i < len(m.shards):
		return authority.Invalid(fmt.Sprintf("escrow: shard %d is already another shard's.", i))
	}
	m.shards = append(m.shards, sh)
	return nil
}

// sameShard reports whether a and b are the same comparable value (a
// Shard of an uncomparable type is never the same).
func sameShard(a, b Shard) bool {
	ta := reflect.TypeOf(a)
	return ta == reflect.TypeOf(b) && ta != nil && ta.Comparable() && a == b
}

// Shards returns the mover's shard count (Config.Shards, and every shard
// AddShard added).
func (m *Mover) Shards() int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return len(m.shards)
}

type hook struct {
	m     *Mover
	shard int
}

func (h hook) Grow(ctx context.Context, req etcdstore.BudgetRequest) error {
	return h.m.Grow(ctx, h.shard, req)
}

// errNotAttached is the cause of a step asked of a mover missing a shard.
var errNotAttached = errors.New("escrow: a shard is not attached yet")

// ready returns the attached shards, or ErrUnavailable.
func (m *Mover) ready() ([]Shard, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	for _, sh := range m.shards {
		if sh == nil {
			return nil, authority.Wrap(authority.ErrUnavailable, "capacity escrow not ready", errNotAttached)
		}
	}
	return slices.Clone(m.shards), nil
}

// home returns the index of node's home shard among shards, checked.
func (m *Mover) home(node authority.NodeDescriptor, shards int) (int, error) {
	h := m.cfg.Home(node)
	if h < 0 || h >= shards {
		return 0, authority.Invalid(fmt.Sprintf("escrow: Home returned shard %d of %d.", h, shards))
	}
	return h, nil
}

// Stats counts a mover's work since New.
type Stats struct {
	// Grows is the Grow calls; Grants the ledger grants they made;
	// Exhausted the Grow calls the policy refused after a reclaim;
	// Reclaims the reclaims of every shard's slack (by Grow, Reclaim and
	// ReclaimAll).
	Grows, Grants, Exhausted, Reclaims int64
}

// Stats returns the mover's counts.
func (m *Mover) Stats() Stats {
	return Stats{Grows: m.stats.grows.Load(), Grants: m.stats.grants.Load(), Exhausted: m.stats.exhausted.Load(), Reclaims: m.stats.reclaims.Load()}
}
