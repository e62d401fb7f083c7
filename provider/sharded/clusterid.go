package sharded

import (
	"context"
	"crypto/sha256"
	"encoding/hex"

	"github.com/zlink-systems/authority/provider/etcd/schema"
)

// ClusterID names the lineage of clusters the store's ownership tokens
// come from, for fencing.Guard.ForCluster. A row's token comes from its
// shard's cluster; a row changes cluster only through a resharding, which
// keeps its token or raises it (package reshard, rowversion.go), so tokens
// only rise per row and the ID must not change when the map grows.
//
//   - Over one shard, and over a namespace that grew from one cluster
//     (schema.ShardMap.Raw), it is shard 0's cluster ID, as
//     etcd.Store.ClusterID gives it: a fence table a single-cluster store
//     bound keeps working through every growth.
//   - Over a namespace created with several shards it is "shards:" and a
//     digest of the map it was created with (its epoch, hash and each of
//     its shards' cluster ID and namespace), which a growth keeps: the
//     first HomeShards shards at the epoch before the growths.
//
// A shard whose cluster was replaced (a restore under a new cluster ID) no
// longer matches the stored map, and New refuses it (ErrShardMapMismatch).
func (s *Store) ClusterID(ctx context.Context) (string, error) {
	if err := s.begin(ctx); err != nil {
		return "", err
	}
	t := s.topo.Load()
	if id, ok := createdMapID(t.smap); ok {
		return id, nil
	}
	id, err := t.shards[0].store.ClusterID(ctx)
	return id, inShard(0, err)
}

// createdMapID returns the ClusterID of a namespace created with several
// shards (ok false: one that has, or grew from, a single cluster): the
// digest of the map it was created with, rebuilt from m.
func createdMapID(m schema.ShardMap) (string, bool) {
	if len(m.Shards) == 1 || m.Raw {
		return "", false
	}
	homes := m.Homes()
	created := schema.ShardMap{Epoch: m.Epoch - int64(len(m.Shards)-homes), Hash: m.Hash, Shards: m.Shards[:homes]}
	sum := sha256.Sum256([]byte(created.Encode()))
	return "shards:" + hex.EncodeToString(sum[:16]), true
}
