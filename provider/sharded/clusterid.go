package sharded

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
)

// ClusterID names the set of clusters the store's ownership tokens come
// from, for fencing.Guard.ForCluster. A row's token comes from its shard's
// cluster, and a row never changes shard under one map, so a fence table
// bound to the shard set refuses a token of another set (another cluster
// in any shard, another order, another map epoch) with
// fencing.ErrOtherCluster. Over one shard it is that cluster's ID (as
// etcd.Store.ClusterID), so a fence table a single-cluster store bound
// keeps working. Over several it is "shards:" and a digest of the shard
// map (its epoch, hash and each shard's cluster ID and namespace).
func (s *Store) ClusterID(ctx context.Context) (string, error) {
	if err := s.begin(ctx); err != nil {
		return "", err
	}
	if len(s.shards) == 1 {
		id, err := s.shards[0].store.ClusterID(ctx)
		return id, inShard(0, err)
	}
	sum := sha256.Sum256([]byte(s.smap.Encode()))
	return "shards:" + hex.EncodeToString(sum[:16]), nil
}
