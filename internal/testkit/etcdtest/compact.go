package etcdtest

import (
	"context"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Compact makes every revision read so far unreadable in the cluster of
// each client: it writes (and deletes) a probe key so the revision moves
// on, then compacts at the new revision. It skips t on an external cluster:
// compaction is cluster-wide.
func Compact(t testing.TB, clients ...*clientv3.Client) {
	t.Helper()
	SkipIfExternal(t, "compacting expires scans but would compact every key of the cluster")
	ctx := context.Background()
	for _, c := range clients {
		probe := Namespace() + "compaction-probe"
		if _, err := c.Put(ctx, probe, ""); err != nil {
			t.Fatal(err)
		}
		resp, err := c.Delete(ctx, probe)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
			t.Fatal(err)
		}
	}
}
