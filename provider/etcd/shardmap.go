package etcd

import (
	"context"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/provider/etcd/internal/txnkit"
	"github.com/zlink-systems/authority/provider/etcd/schema"
)

// The shard map in a shard's namespace (package provider/sharded composes
// one Store per shard and checks the map at New). The provider itself reads
// it only at New, to refuse a plain writing store on one shard of several
// (ErrShardedNamespace): a namespace without a map is the one-shard case.

// ErrShardedNamespace reports a namespace that is one shard of a store over
// several etcd clusters (its shard map lists more than one shard), opened by
// a writing store that is not one of that store's shards: its writes would
// skip the map's routing, the capacity escrow and the cross-shard row locks,
// placing rows in the wrong shard or admitting capacity twice. New refuses
// it before writing anything, with an error wrapping this and
// authority.ErrInvalidArgument that names the namespace, the map's epoch and
// its shard count: open the namespace with provider/sharded. A read-only
// store opens, and so does a store with Config.ShardMember. A single-cluster
// store already running when a resharding freezes or switches its cluster
// stops on its standing fence (shardfence.go): every write, row read and
// listing fails with an error wrapping this and authority.ErrUnavailable, having
// written nothing.
var ErrShardedNamespace = errors.New("etcd: namespace is one shard of a store over several clusters")

// ShardMapState is what a namespace holds of the shard map.
type ShardMapState struct {
	// Map is the stored map (valid when Found).
	Map schema.ShardMap
	// Found says the namespace holds a shard map.
	Found bool
	// HasRows says the namespace holds at least one row (reported by
	// CreateShardMap when it did not create the map).
	HasRows bool
}

// ReadShardMap reads the namespace's shard map (linearizably). A map that
// does not decode is ErrCorrupt naming the key.
func (s *Store) ReadShardMap(ctx context.Context) (ShardMapState, error) {
	if err := s.begin(ctx); err != nil {
		return ShardMapState{}, err
	}
	key := s.keys.ShardMap()
	resp, err := s.read(unfenced(ctx), opGet(key))
	if err != nil {
		return ShardMapState{}, err
	}
	return decodeShardMapState(txnkit.ReadsOf(resp)[key])
}

// CreateShardMap puts m as the namespace's shard map in one Txn that holds
// only while the namespace has no shard map and no row: a map is created
// once, and never over rows a single-cluster store (or another map) placed.
// created reports whether it was put; otherwise the state says why (the map
// found, or HasRows). A read-only store refuses it (ErrReadOnly).
func (s *Store) CreateShardMap(ctx context.Context, m schema.ShardMap) (created bool, st ShardMapState, err error) {
	if err := s.refuseWrite(); err != nil {
		return false, ShardMapState{}, err
	}
	if err := m.Check(); err != nil {
		return false, ShardMapState{}, err
	}
	if err := s.begin(ctx); err != nil {
		return false, ShardMapState{}, err
	}
	key, rows := s.keys.ShardMap(), s.keys.RowsPrefix()
	els, counted := txnkit.AddRead([]clientv3.Op{opGet(key)}, clientv3.OpGet(rows, clientv3.WithPrefix(), clientv3.WithCountOnly()))
	rctx, cancel := s.requestContext(ctx)
	defer cancel()
	resp, err := s.kv.Txn(rctx).If(
		modRevIs(key, 0),
		clientv3.Compare(clientv3.CreateRevision(rows), "=", 0).WithPrefix(),
	).Then(clientv3.OpPut(key, m.Encode())).Else(els...).Commit()
	if err != nil {
		return false, ShardMapState{}, mapError(err, true)
	}
	if resp.Succeeded {
		return true, ShardMapState{Map: m, Found: true}, nil
	}
	st, err = decodeShardMapState(txnkit.ReadsOf(resp)[key])
	st.HasRows = counted.In(resp).GetCount() > 0
	return false, st, err
}

func decodeShardMapState(kv *mvccpbKV) (ShardMapState, error) {
	if kv == nil {
		return ShardMapState{}, nil
	}
	m, err := schema.DecodeShardMap(kv)
	if err != nil {
		return ShardMapState{}, err
	}
	return ShardMapState{Map: m, Found: true}, nil
}

// refuseShardedNamespace is New's check of a writing store that is not a
// shard member (Config.ShardMember or ShardMapFence): it reads the
// namespace's shard map keys and refuses one of several shards, or one a
// resharding is moving rows out of (ErrShardedNamespace): such a store's
// writes would not be fenced on the map, so one could be acknowledged under
// a map no longer in force. It writes nothing. It returns the map key's
// ModRevision (0: absent), the store's standing fence (shardfence.go).
func (s *Store) refuseShardedNamespace(ctx context.Context) (int64, error) {
	resp, err := s.read(unfenced(ctx), clientv3.OpGet(s.keys.ShardMapPrefix(), clientv3.WithPrefix()))
	if err != nil {
		return 0, err
	}
	k, err := s.Moves().mapKeysIn(resp)
	switch {
	case err != nil:
		return 0, err
	case k.Current != nil && len(k.Current.Shards) > 1:
		return 0, authority.Wrap(authority.ErrInvalidArgument, fmt.Sprintf(
			"namespace %s is one shard of a store over %d etcd clusters (shard map epoch %d): open it with provider/sharded, "+
				"not as a single-cluster store (Config.ShardMember is for a shard's own store)",
			s.keys.Namespace(), len(k.Current.Shards), k.Current.Epoch), ErrShardedNamespace)
	case k.Pending != nil:
		return 0, authority.Wrap(authority.ErrInvalidArgument, fmt.Sprintf(
			"namespace %s: resharding job %s is moving rows to shard map epoch %d (%d shards): open it with provider/sharded, "+
				"not as a single-cluster store",
			s.keys.Namespace(), k.Pending.Job, k.Pending.To.Epoch, len(k.Pending.To.Shards)), ErrShardedNamespace)
	}
	return k.CurrentRev, nil
}
