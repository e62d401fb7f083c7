package sharded

import (
	"context"
)

// ClusterID names the lineage of clusters the store's ownership tokens
// come from, for fencing.Guard.ForCluster: shard 0's cluster ID, as
// etcd.Store.ClusterID gives it, whatever the number of shards. A row's
// token comes from its shard's cluster, and a row changes cluster only
// through a resharding, which keeps its token and raises the new cluster's
// revisions above every revision of its sources (package reshard), so
// tokens still only rise per row: a fence table bound to the shard set
// keeps working when the map grows, from one shard to several included.
// Shard 0 is never replaced by a resharding; a shard whose cluster was
// replaced (a restore under a new cluster ID) no longer matches the stored
// map, and New refuses it (ErrShardMapMismatch).
func (s *Store) ClusterID(ctx context.Context) (string, error) {
	if err := s.begin(ctx); err != nil {
		return "", err
	}
	id, err := s.topo.Load().shards[0].store.ClusterID(ctx)
	return id, inShard(0, err)
}
