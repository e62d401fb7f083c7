package etcd

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// ClusterID returns the ID of the etcd cluster the store works on, in the
// hexadecimal form etcdctl prints (for example "cdf818194e3a8c32"). Every
// response the store has seen came from it (a response of another cluster
// makes the store refuse every request: ErrClusterRegressed). Ownership
// tokens are comparable only within one cluster: a new cluster, a restore
// under a new cluster token, or a copy of the namespace to another cluster
// starts them low again. fencing.Guard.ForCluster takes this ID, so that a
// fence table tells a new cluster from a stale writer.
//
// It reads the namespace once (serializably) when the store has not yet had
// a response.
func (s *Store) ClusterID(ctx context.Context) (string, error) {
	if id := s.guard.ClusterID(); id != 0 {
		return fmt.Sprintf("%x", id), nil
	}
	ctx, cancel := s.requestContext(ctx)
	defer cancel()
	resp, err := s.kv.Get(ctx, s.keys.Namespace(), clientv3.WithCountOnly(), clientv3.WithSerializable())
	if err != nil {
		return "", mapError(err, false)
	}
	return fmt.Sprintf("%x", resp.Header.ClusterId), nil
}
