package etcd

import (
	"context"
	"errors"
	"fmt"
	"slices"

	authority "github.com/zlink-systems/authority"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/zlink-systems/authority/provider/etcd/internal/txnkit"
)

// The shard map fence (Config.ShardMapFence). A store over several clusters
// (provider/sharded) routes each operation by the shard map it loaded, and
// a resharding changes the map key of every shard when it freezes rows and
// when it switches to the next map. So that no write is acknowledged under
// a map no longer in force, every write Txn of such a shard's store compares
// the namespace's shard-map key's ModRevision with the one the operation was
// routed with (the caller's context: WithShardMapRevision), and every read of
// rows reads that key in the same Txn and checks it. A write or read that
// finds the key moved fails with ErrShardMapChanged, having written nothing;
// the caller reloads the map and routes again.

// ErrShardMapChanged reports that the namespace's shard map key is not at
// the ModRevision the operation was routed with: a resharding moved it on
// (froze rows, or switched maps). Nothing was written. It wraps
// authority.ErrUnavailable: the operation may be retried once routed again.
var ErrShardMapChanged = errors.New("etcd: the shard map changed")

// The standing fence. A writing store that no router fences (neither
// Config.ShardMapFence nor ShardMember: a single-cluster store) cannot
// follow a shard map, so it fences every write Txn and row read on the map
// key's ModRevision New read (0: absent): when a resharding freezes or
// switches its cluster, the key moves and the store stops, with
// ErrShardedNamespace (and ErrUnavailable), instead of acknowledging a
// write the move would lose or answering a read of a row that moved.

// standingFence is a single-cluster store's map fence: on, at rev.
type standingFence struct {
	on  bool
	rev int64
}

type shardMapRevKey struct{}

// shardMapRev is the map fence a context carries: rev, for the store st
// (nil: any store); off: none (unfenced), not even a standing one.
type shardMapRev struct {
	st  *Store
	rev int64
	off bool
}

// WithShardMapRevision returns ctx carrying rev, the ModRevision of the
// namespace's shard-map key (0: absent) an operation was routed with. On a
// store with Config.ShardMapFence every write Txn and row read made on ctx
// holds only while the key is still at rev. A context without it is not
// fenced (a caller writing outside any map: tests, tools). Every store the
// context reaches checks it; Store.WithShardMapRevision binds it to one.
func WithShardMapRevision(ctx context.Context, rev int64) context.Context {
	return context.WithValue(ctx, shardMapRevKey{}, shardMapRev{rev: rev})
}

// WithShardMapRevision returns ctx carrying rev as s's map fence only: an
// operation of s that calls into another shard's store (the capacity
// escrow's ledger in a node's home shard) does not hand that store a
// revision of s's map key, which it would compare with its own.
func (s *Store) WithShardMapRevision(ctx context.Context, rev int64) context.Context {
	return context.WithValue(ctx, shardMapRevKey{}, shardMapRev{st: s, rev: rev})
}

// unfenced returns ctx without a shard map revision (the steps of a
// resharding read and write the map keys themselves).
func unfenced(ctx context.Context) context.Context {
	return context.WithValue(ctx, shardMapRevKey{}, shardMapRev{off: true})
}

// mapFence returns the shard map revision ctx carries for s, when the
// store is fenced on the map, or a single-cluster store's standing one.
func (s *Store) mapFence(ctx context.Context) (int64, bool) {
	f, ok := ctx.Value(shardMapRevKey{}).(shardMapRev)
	switch {
	case ok && f.off:
		return 0, false
	case !s.shardFence:
		return s.standing.rev, s.standing.on
	case !ok || f.st != nil && f.st != s:
		return 0, false
	}
	return f.rev, true
}

// keepFenceRoom lowers the request size every planner of a Txn uses
// (s.maxBytes: the reservation group, pruning, rebinding, the write
// batcher) by what the map fence adds to a write (fenceWrite: its compare
// and the Else read of the map key), on a store whose writes carry one
// (Config.ShardMapFence, or a single-cluster writing store's standing
// fence), so that a Txn planned to fit still fits once fenced. (Operation
// counts need no room: etcd bounds the compares, the Then and the Else
// each, and the planners fill the Then; the reservation group counts the
// fence's compare, fenceCmps.) sendRaw checks the fenced Txn against the
// configured limits (s.wire).
// It also turns the standing fence on for a single-cluster writing store
// (New sets its revision, refuseShardedNamespace).
func (s *Store) keepFenceRoom(cfg Config) {
	s.wire = s.limits()
	s.standing.on = !cfg.ShardMapFence && !cfg.ReadOnly && !cfg.ShardMember
	if !s.mapFenced() {
		return
	}
	key := s.keys.ShardMap()
	room := &txnkit.Txn{}
	room.Cmp(s.mapCmp(0))
	room.OrGet(key, clientv3.WithKeysOnly())
	s.maxBytes -= room.Bytes
}

// mapFenced reports whether the store's writes carry a map fence: a
// router's (Config.ShardMapFence) or the standing one.
func (s *Store) mapFenced() bool { return s.shardFence || s.standing.on }

// mapCmp is the compare of the shard map fence at rev.
func (s *Store) mapCmp(rev int64) clientv3.Cmp { return modRevIs(s.keys.ShardMap(), rev) }

// addMapFence adds ctx's map fence to t (once).
func (s *Store) addMapFence(ctx context.Context, t *txnkit.Txn) {
	if rev, ok := s.mapFence(ctx); ok {
		t.CmpOnce(s.mapCmp(rev))
	}
}

// fenceWrite returns t with ctx's map fence and the read of the map key in
// its Else (a clone: the caller's t may be sent again), and the map
// revisions t compares (a group commit adds one per waiter); nil when t is
// not fenced on the map.
func (s *Store) fenceWrite(ctx context.Context, t *txnkit.Txn) (*txnkit.Txn, []int64) {
	if !s.mapFenced() {
		return t, nil
	}
	key := s.keys.ShardMap()
	revs := s.mapRevsIn(t)
	rev, ok := s.mapFence(ctx)
	if ok && !slices.Contains(revs, rev) {
		revs = append(revs, rev)
	}
	if len(revs) == 0 {
		return t, nil
	}
	t = t.Clone()
	s.addMapFence(ctx, t)
	t.OrGet(key, clientv3.WithKeysOnly())
	return t, revs
}

// mapRevsIn returns the map revisions t already compares.
func (s *Store) mapRevsIn(t *txnkit.Txn) []int64 {
	key := s.keys.ShardMap()
	var revs []int64
	for _, c := range t.Cmps {
		if pc := c.GetCompare(); string(pc.Key) == key && pc.Target == pb.Compare_MOD && pc.Result == pb.Compare_EQUAL {
			revs = append(revs, pc.GetModRevision())
		}
	}
	return revs
}

// mapChanged checks a failed fenced write: when the map key is not at every
// revision the Txn compared, it is ErrShardMapChanged. (The read of the map
// key fenceWrite added stays in resp: callers find reads by key or handle,
// and it comes after theirs.)
func (s *Store) mapChanged(resp *clientv3.TxnResponse, revs []int64) error {
	if len(revs) == 0 || resp.Succeeded {
		return nil
	}
	kv := txnkit.KVNamed(resp, s.keys.ShardMap())
	var at int64
	if kv != nil {
		at = kv.ModRevision
	}
	for _, rev := range revs {
		if rev != at {
			return s.mapMoved(rev, at)
		}
	}
	return nil
}

func (s *Store) mapMoved(routed, at int64) error {
	if !s.shardFence {
		return authority.Wrap(authority.ErrUnavailable, fmt.Sprintf(
			"Namespace %s: a resharding froze or switched this cluster (its shard map key is at revision %d, not %d as when this store opened), "+
				"and a single-cluster store cannot follow a shard map: it refuses every write, row read and listing; open the namespace with provider/sharded.",
			s.keys.Namespace(), at, routed), ErrShardedNamespace)
	}
	return authority.Wrap(authority.ErrUnavailable, fmt.Sprintf(
		"The shard map of namespace %s is at revision %d, not %d as routed: a resharding moved it on; route again.",
		s.keys.Namespace(), at, routed), ErrShardMapChanged)
}

// fenceRead appends the read of the map key to a read-only Txn's ops when
// ctx is fenced on the map.
func (s *Store) fenceRead(ctx context.Context, ops []clientv3.Op) ([]clientv3.Op, int64, bool) {
	rev, ok := s.mapFence(ctx)
	if !ok {
		return ops, 0, false
	}
	return append(slices.Clip(ops), clientv3.OpGet(s.keys.ShardMap(), clientv3.WithKeysOnly())), rev, true
}

// readChanged checks a fenced read's map key (read last, after the
// caller's reads, which it leaves where they are).
func (s *Store) readChanged(resp *clientv3.TxnResponse, rev int64) error {
	var at int64
	if kv := txnkit.KVNamed(resp, s.keys.ShardMap()); kv != nil {
		at = kv.ModRevision
	}
	if at != rev {
		return s.mapMoved(rev, at)
	}
	return nil
}

// CheckShardMap reads the namespace's shard-map key and returns
// ErrShardMapChanged unless it is at the revision ctx carries (nil when ctx
// carries none, or the store is not fenced on the map): a listing's first
// page, read at the current revision, calls it after the page, so the page
// was read under the map it was routed by.
func (s *Store) CheckShardMap(ctx context.Context) error {
	if _, ok := s.mapFence(ctx); !ok {
		return nil
	}
	if err := s.begin(ctx); err != nil {
		return err
	}
	_, err := s.read(ctx)
	return err
}
