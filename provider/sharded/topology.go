package sharded

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	authority "github.com/zlink-systems/authority"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/sharded/twophase"
)

// The map in force, and a resharding in progress (package
// provider/sharded/reshard, issue 43).
//
// A store routes each operation by a topology: the shard map in force, the
// shards' stores, and for each shard the ModRevision of its map key the
// store last read. Every write Txn of a shard, and every read of rows,
// carries that revision as a compare (etcd Config.ShardMapFence): a
// resharding moves the map key of every shard it freezes or switches, so an
// operation routed by a topology no longer in force fails in the cluster,
// having written nothing (etcd.ErrShardMapChanged). The store then reloads
// the map keys and routes the operation again: transparently when the row
// stays where it is, or with ErrMoving while the shard it lives in is frozen
// for the move of its row. An operation is routed again at most
// maxReroutes times.
//
// While a move is pending the topology also holds the new cluster (opened
// from Config.Spares), where the store takes an owner lease for each of its
// owners, so that the owners are live there when the rows arrive.

// ErrMoving reports a write to a row whose shard is frozen for a
// resharding that moves the row to another shard: the write is refused
// (nothing was written) until the switch to the next map ends, which takes
// as long as the job needs to apply the last changes and switch every
// cluster (docs/operations.md, "Adding a cluster"). It wraps
// authority.ErrUnavailable: retry it. The error names the row, both shards
// and the job.
var ErrMoving = errors.New("sharded: the row is moving to another shard")

// maxReroutes bounds how often one operation is routed again after the map
// moved under it.
const maxReroutes = 8

// topology is one state of the map in force, as the store read it. It is
// never changed once published; a newer one replaces it.
type topology struct {
	// smap is the map in force; shards its shards, in its order.
	smap   schema.ShardMap
	shards []*shard
	// fence is, by shard, the ModRevision of its map key (0: absent) that
	// operations routed by this topology compare.
	fence []int64
	// move is the resharding in progress (pending, or frozen in some
	// shards); nil when none. frozen says, by shard, that the shard holds
	// the move's switching key.
	move   *schema.ShardMove
	frozen []bool
	// target is the move's new cluster while the map in force is its From
	// map (nil before it is opened); targetFence the ModRevision of its map
	// key then (0: none yet, the switch has not reached it).
	target      *shard
	targetFence int64
	// num translates row numbers between the shards' stores and the
	// store's (rowversion.go); coord runs the two-phase protocol of
	// aggregates across its shards and resolves the row locks it leaves
	// (nil over one shard). publish sets both.
	num   numbering
	coord *twophase.Coordinator
	// done is closed when a newer topology replaced this one; readAt is
	// when its map keys were read.
	done   chan struct{}
	readAt time.Time
}

// refusedReload is how old a topology may be for a refusal (ErrMoving) to
// be answered from it: an older one is read again first, so a store whose
// watch has not reported the switch yet does not refuse after it.
const refusedReload = 20 * time.Millisecond

// stale reports whether a refusal from t must read the map again first.
func (t *topology) stale() bool { return time.Since(t.readAt) > refusedReload }

// shardOf returns the shard of key under the map in force.
func (t *topology) shardOf(key authority.Key) int { return shardOf(string(key), len(t.shards)) }

// at returns ctx carrying shard i's map fence.
func (t *topology) at(ctx context.Context, i int) context.Context {
	return t.shards[i].store.WithShardMapRevision(ctx, t.fence[i])
}

// switching reports whether shard i is frozen for the move, and the map in
// force is still the move's From map: its rows that move may not be
// written.
func (t *topology) switching(i int) bool {
	return t.move != nil && t.frozen[i] && t.smap.Epoch == t.move.From.Epoch
}

// refuse returns ErrMoving when a write of key in shard i must wait for
// the switch.
func (t *topology) refuse(key authority.Key, i int) error {
	if !t.switching(i) {
		return nil
	}
	to := shardOf(string(key), len(t.move.To.Shards))
	if to == i {
		return nil
	}
	return authority.Wrap(authority.ErrUnavailable, fmt.Sprintf(
		"Row %q is moving from shard %d to shard %d (resharding job %s, shard map epoch %d to %d): its writes are refused until the switch ends; retry.",
		key, i, to, t.move.Job, t.move.From.Epoch, t.move.To.Epoch), ErrMoving)
}

// refuseFrozen returns ErrMoving when an operation over whole shards (what
// names it) meets a frozen shard: it would write rows that move.
func (t *topology) refuseFrozen(what string) error {
	for i := range t.shards {
		if t.switching(i) {
			return authority.Wrap(authority.ErrUnavailable, fmt.Sprintf(
				"%s waits for the switch of resharding job %s (shard %d is frozen, shard map epoch %d to %d); retry.",
				what, t.move.Job, i, t.move.From.Epoch, t.move.To.Epoch), ErrMoving)
		}
	}
	return nil
}

// index returns the shard of t with id (-1: none).
func (t *topology) index(sh *shard) int {
	for i, x := range t.shards {
		if x == sh {
			return i
		}
	}
	return -1
}

// stores returns every store the topology writes to: its shards and the
// move's new cluster.
func (t *topology) stores() []*shard {
	out := append([]*shard(nil), t.shards...)
	if t.target != nil {
		out = append(out, t.target)
	}
	return out
}

// frozen reports whether a source of t is frozen for the move while the
// map in force is still its From map: the new cluster may switch to the
// next map (it switches first) before t is read again.
func (t *topology) frozenAny() bool {
	for i := range t.shards {
		if t.switching(i) {
			return true
		}
	}
	return false
}

// checkSwitched is the read fence of a frozen topology: a read served by a
// frozen source holds only if the new cluster had not switched yet when
// the read was done (a row written there since would be newer), so it
// reads the new cluster's map key after the read (ErrShardMapChanged when
// it switched: the reader routes again).
func (t *topology) checkSwitched(ctx context.Context) error {
	if t.target == nil || !t.frozenAny() {
		return nil
	}
	return t.target.store.CheckShardMap(t.target.store.WithShardMapRevision(ctx, t.targetFence))
}

// onRow runs fn on the shard of key under the map in force, fn's context
// carrying the shard's map fence. A write to a row that is moving is
// ErrMoving; a read of one is checked against the new cluster's switch
// (checkSwitched). When the map moved under fn, the store reloads it and
// runs fn again on the row's shard then.
func (s *Store) onRow(ctx context.Context, key authority.Key, write bool, fn func(ctx context.Context, sh *shard) error) error {
	return s.onRowAt(ctx, key, write, func(ctx context.Context, _ *topology, sh *shard) error { return fn(ctx, sh) })
}

// onRowAt is onRow with fn also given the topology it was routed by.
func (s *Store) onRowAt(ctx context.Context, key authority.Key, write bool, fn func(ctx context.Context, t *topology, sh *shard) error) error {
	for attempt := 0; ; attempt++ {
		t := s.topo.Load()
		i := t.shardOf(key)
		var err error
		if write {
			err = t.refuse(key, i)
		}
		if err == nil {
			err = inShard(i, fn(t.at(ctx, i), t, t.shards[i]))
		}
		if err == nil && !write && t.switching(i) {
			err = t.checkSwitched(ctx)
		}
		if !s.reroute(t, err) || attempt == maxReroutes {
			return err
		}
		if err := s.refresh(ctx, t); err != nil {
			return err
		}
	}
}

// onObject is onRow for an object key; a key that does not encode goes to
// shard 0, whose store refuses it as any store does.
func (s *Store) onObject(ctx context.Context, k authority.ObjectKey, fn func(ctx context.Context, sh *shard) error) error {
	return s.onObjectAt(ctx, k, func(ctx context.Context, _ *topology, sh *shard) error { return fn(ctx, sh) })
}

// onObjectAt is onObject with fn also given the topology it was routed by.
func (s *Store) onObjectAt(ctx context.Context, k authority.ObjectKey, fn func(ctx context.Context, t *topology, sh *shard) error) error {
	key, err := k.Encode()
	if err != nil {
		t := s.topo.Load()
		return inShard(0, fn(ctx, t, t.shards[0]))
	}
	return s.onRowAt(ctx, key, true, fn)
}

// rerouted runs op, a whole operation over a topology it takes itself,
// again (after reloading the map) as long as it fails because the map moved
// under it, at most maxReroutes times.
func (s *Store) rerouted(ctx context.Context, op func(t *topology) error) error {
	for attempt := 0; ; attempt++ {
		t := s.topo.Load()
		err := op(t)
		if !s.reroute(t, err) || attempt == maxReroutes {
			return err
		}
		if err := s.refresh(ctx, t); err != nil {
			return err
		}
	}
}

// reroute reports whether an operation routed by t that failed with err
// is routed again once the map is read: the map moved under it, or it was
// refused (ErrMoving) by a topology read a while ago.
func (s *Store) reroute(t *topology, err error) bool {
	return errors.Is(err, etcdstore.ErrShardMapChanged) || errors.Is(err, ErrMoving) && t.stale()
}

// publish makes t the topology in force and tells the holders of the one
// it replaced.
func (s *Store) publish(t *topology) {
	t.done, t.readAt = make(chan struct{}), time.Now()
	t.num = numbering{n: len(t.shards), raw: t.smap.Raw}
	if len(t.shards) > 1 {
		shards := make([]twophase.Shard, len(t.shards))
		for i, sh := range t.shards {
			shards[i] = fencedShard{twophase.EtcdShard(sh.store), sh.store, t.fence[i]}
		}
		t.coord, _ = twophase.New(shards, router{t}) // no nil shard, a router: no error
	}
	if old := s.topo.Swap(t); old != nil {
		close(old.done)
	}
}

// growth is what a store opened beyond its configured shards, and the lock
// of its map reloads.
type growth struct {
	mu sync.Mutex
	// opened is every shard store the store opened (closed at Close).
	opened []*shard
	// spares are Config.Spares, by index: the cluster each names, once
	// asked.
	spares []spare
	// stopWatch ends the map watch: set once by New before the watch
	// starts, called by Close without mu (a reload holding mu may wait on
	// the watch's context).
	stopWatch context.CancelFunc
}

// spare is a Config.Spares cluster: its identity once probed.
type spare struct {
	probed bool
	id     schema.ShardMapShard
	opened *shard
}

func (g *growth) stop() {
	if g.stopWatch != nil {
		g.stopWatch()
	}
}

func shardID(sh *shard) schema.ShardMapShard {
	return schema.ShardMapShard{ClusterID: sh.clusterID, Namespace: sh.namespace}
}

// router places rows and aggregate records for the two-phase protocol, by
// the topology's map.
type router struct{ t *topology }

func (r router) ShardOf(key authority.Key) int        { return r.t.shardOf(key) }
func (r router) CoordinatorOf(aggregateID string) int { return r.t.coordinatorOf(aggregateID) }

// coordinatorOf returns the coordinator shard of aggregateID under t's map:
// a hash of the ID over the map's home shards (schema.ShardMap.Homes), not
// over all its shards, so that it stays the same when a resharding grows
// the map (the record of an aggregate prepared before is found after).
func (t *topology) coordinatorOf(aggregateID string) int {
	return coordinatorOf(aggregateID, min(t.smap.Homes(), len(t.shards)))
}

// coordinatorOf returns the coordinator shard of aggregateID over n shards.
func coordinatorOf(aggregateID string, n int) int { return shardOf(aggregateDomain+aggregateID, n) }
