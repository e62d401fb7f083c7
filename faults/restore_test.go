package faults_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
)

// restoreRows is how many rows the restore workload writes.
const restoreRows = 12

// restoreTraffic is a workload of compare-and-swaps on restoreRows rows of
// one owner lease, remembering the last row state acknowledged for each
// row: the versions a caller holds when the cluster is restored.
type restoreTraffic struct {
	st     *etcdstore.Store
	tgt    authority.CreationTarget
	mu     sync.Mutex
	held   map[authority.Key]*authority.Snapshot
	writes int
}

func (w *restoreTraffic) acked(key authority.Key, s *authority.Snapshot) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.held[key] = s
	w.writes++
}

func (w *restoreTraffic) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.writes
}

// run creates the rows, then rewrites them in turn until ctx ends.
func (w *restoreTraffic) run(ctx context.Context, t *testing.T) {
	keys := make([]authority.Key, restoreRows)
	for i := range keys {
		req := reserveRequest(authority.ObjectUserSpot, fmt.Sprintf("r-%d", i), w.tgt, "creating")
		keys[i] = objectKey(t, authority.ObjectUserSpot, req.Key.GlobalID)
		w.acked(keys[i], mustCommit(t, w.st, mustReserve(t, w.st, req), "ready"))
	}
	for n := 0; ctx.Err() == nil; n++ {
		key := keys[n%len(keys)]
		w.mu.Lock()
		cur := w.held[key]
		w.mu.Unlock()
		res, err := w.st.CompareExchangeAuthority(ctx, key, cur.StoreVersion, authority.Put([]byte("write-"+strconv.Itoa(n))))
		if err != nil || res.Kind != authority.KindStored {
			if ctx.Err() == nil {
				t.Errorf("rewrite %s: %v %v", key, err, res.Kind)
			}
			return
		}
		w.acked(key, res.Snapshot)
	}
}

// restoreCluster is one trial's single-member cluster: its data directory
// and the server running on it.
type restoreCluster struct {
	t      *testing.T
	srv    *etcdtest.Server
	cli    *clientv3.Client
	backup string
}

// snapshotNow saves a snapshot of the running member (as etcdctl snapshot
// save does) and returns its revision.
func (c *restoreCluster) snapshotNow(ctx context.Context) int64 {
	c.t.Helper()
	rc, err := c.cli.Snapshot(ctx)
	if err != nil {
		c.t.Fatalf("snapshot: %v", err)
	}
	defer rc.Close()
	f, err := os.Create(c.backup)
	if err != nil {
		c.t.Fatal(err)
	}
	if _, err := io.Copy(f, rc); err != nil {
		c.t.Fatalf("snapshot: %v", err)
	}
	if err := f.Close(); err != nil {
		c.t.Fatal(err)
	}
	st, err := snapshot.NewV3(zap.NewNop()).Status(c.backup)
	if err != nil {
		c.t.Fatalf("snapshot status: %v", err)
	}
	return st.Revision
}

// restoreFromBackup stops the member, restores the backup into a new data
// directory (as etcdutl snapshot restore does: with bump > 0, the revision
// is bumped by bump and marked compacted; token is the new
// --initial-cluster-token) and starts the member on it. The client follows.
func (c *restoreCluster) restoreFromBackup(bump uint64, token string) {
	c.t.Helper()
	c.srv.Close()
	dir := filepath.Join(c.t.TempDir(), "restored")
	peer := "http://127.0.0.1:0" // etcdtest's member advertises this peer URL
	err := snapshot.NewV3(zap.NewNop()).Restore(snapshot.RestoreConfig{
		SnapshotPath: c.backup, Name: "etcdtest", OutputDataDir: dir,
		PeerURLs: []string{peer}, InitialCluster: "etcdtest=" + peer, InitialClusterToken: token,
		RevisionBump: bump, MarkCompacted: bump > 0,
	})
	if err != nil {
		c.t.Fatalf("restore: %v", err)
	}
	c.srv = etcdtest.Start(c.t, etcdtest.WithDir(dir))
	c.cli.SetEndpoints(c.srv.Endpoint())
}

// restoreTrialCounts are the figures of one trial.
type restoreTrialCounts struct {
	staleApplied, refused, candidates, leasesRestored, leasesEnded int
}

// restoreTrial runs traffic on a fresh member, snapshots it mid-traffic,
// restores the snapshot (plain, or with the documented procedure when
// documented) and tries every row version the traffic held as a stale
// compare-and-swap.
func restoreTrial(t *testing.T, trial int, documented bool) restoreTrialCounts {
	etcdtest.SkipIfExternal(t, "the test restores its own embedded member from a snapshot")
	ctx := settle(t)
	c := &restoreCluster{t: t, srv: etcdtest.Start(t), backup: filepath.Join(t.TempDir(), "backup.db")}
	c.cli = c.srv.Client(t)
	ns := fmt.Sprintf("/restore/%d/", trial)
	old := newStore(t, c.cli, ns)
	lease, err := old.Registry().Acquire(ctx, conformance.NodeA, conformance.NodeLifecycle, "owner", ownerTTL)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lease.Close(context.Background()) }()
	w := &restoreTraffic{st: old, tgt: conformance.Target(conformance.NodeA, conformance.NodeLifecycle, lease.Token()),
		held: map[authority.Key]*authority.Snapshot{}}
	tctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); w.run(tctx, t) }()
	waitWrites(t, w, restoreRows+20)
	snapRev := c.snapshotNow(ctx)
	waitWrites(t, w, w.count()+40)
	stop()
	<-done
	if _, err := old.ReadAuthority(ctx, objectKey(t, authority.ObjectUserSpot, "r-0")); err != nil {
		t.Fatal(err) // the store sees the cluster's revision after the traffic
	}

	live, err := c.cli.Get(ctx, ns+"owners/", clientv3.WithPrefix())
	if err != nil || len(live.Kvs) != 1 || live.Kvs[0].Lease == 0 {
		t.Fatalf("owner liveness key: %v %v", err, live)
	}
	leaseID := clientv3.LeaseID(live.Kvs[0].Lease)
	var counts restoreTrialCounts
	if documented {
		c.restoreFromBackup(1_000_000, fmt.Sprintf("restored-%d", trial))
	} else {
		c.restoreFromBackup(0, "etcd-cluster")
		counts.candidates = rewriteAtHeldVersions(t, c, ns, w.held, snapRev)
	}
	ttl, err := c.cli.TimeToLive(ctx, leaseID)
	if err == nil && ttl.TTL > 0 {
		counts.leasesRestored++ // the snapshot holds the lease: it lives again
	}
	for key, s := range w.held {
		res, err := old.CompareExchangeAuthority(ctx, key, s.StoreVersion, authority.Put([]byte("stale")))
		switch {
		case errors.Is(err, etcdstore.ErrClusterRegressed) && errors.Is(err, authority.ErrUnavailable):
			counts.refused++
		case err != nil:
			t.Fatalf("stale compare-and-swap on %s: %v", key, err)
		case res.Kind == authority.KindStored:
			counts.staleApplied++
		}
	}
	select {
	case <-lease.Done():
		counts.leasesEnded++
	case <-time.After(10 * time.Second):
		t.Errorf("trial %d: the owner lease from before the restore is still held by its store", trial)
	}
	if documented {
		counts.staleApplied += staleAfterReopen(t, c.cli, ns, w.held)
	}
	return counts
}

// waitWrites waits until the traffic acknowledged n writes.
func waitWrites(t *testing.T, w *restoreTraffic, n int) {
	t.Helper()
	deadline := time.Now().Add(settleTimeout)
	for w.count() < n {
		if time.Now().After(deadline) {
			t.Fatalf("traffic acknowledged %d writes, want %d", w.count(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// rewriteAtHeldVersions is other nodes writing to a cluster restored without
// the documented procedure: it rewrites rows so that each held version after
// the snapshot names, in the restored cluster, a row state other than the
// one its holder saw (a stale compare on it would hold), as far as the
// revisions allow before the old store's highest seen revision. It returns
// how many such stale candidates it made.
func rewriteAtHeldVersions(t *testing.T, c *restoreCluster, ns string, held map[authority.Key]*authority.Snapshot, snapRev int64) int {
	t.Helper()
	ctx := settle(t)
	byRev := map[int64]authority.Key{}
	var top int64
	for k, s := range held {
		v, _ := strconv.ParseInt(string(s.StoreVersion), 10, 64)
		byRev[v] = k
		top = max(top, v)
	}
	made := 0
	for rev := snapRev + 1; rev < top; rev++ {
		key, ok := byRev[rev]
		if !ok {
			continue
		}
		cur, err := c.cli.Get(ctx, "pad")
		if err != nil {
			t.Fatal(err)
		}
		for r := cur.Header.Revision; r < rev-1; r++ {
			if _, err := c.cli.Put(ctx, "pad", "x"); err != nil {
				t.Fatal(err)
			}
		}
		if cur.Header.Revision >= rev {
			continue
		}
		rowKey := ns + "rows/" + string(key)
		row, err := c.cli.Get(ctx, rowKey)
		if err != nil || len(row.Kvs) != 1 {
			t.Fatalf("restored row %s: %v", key, err)
		}
		put, err := c.cli.Put(ctx, rowKey, string(row.Kvs[0].Value)) // the restored state, at the held version
		if err != nil {
			t.Fatal(err)
		}
		if put.Header.Revision == rev {
			made++
		}
	}
	return made
}

// staleAfterReopen opens a new store on the cluster restored with the
// documented procedure and tries every held version: it returns how many
// were applied (the bumped revisions must fence them all).
func staleAfterReopen(t *testing.T, cli *clientv3.Client, ns string, held map[authority.Key]*authority.Snapshot) int {
	t.Helper()
	st := newStore(t, cli, ns)
	applied := 0
	for key, s := range held {
		var res authority.CompareExchangeResult
		eventually(t, "stale compare-and-swap after reopening", func(ctx context.Context) error {
			var err error
			res, err = st.CompareExchangeAuthority(ctx, key, s.StoreVersion, authority.Put([]byte("stale")))
			return err
		})
		if res.Kind == authority.KindStored {
			applied++
		}
	}
	return applied
}

func TestRestoreFromSnapshotFencesStaleVersions(t *testing.T) {
	var sum restoreTrialCounts
	trials := 0
	for trial, documented := range []bool{false, true, false, true} {
		c := restoreTrial(t, trial, documented)
		sum.staleApplied += c.staleApplied
		sum.refused += c.refused
		sum.candidates += c.candidates
		sum.leasesRestored += c.leasesRestored
		sum.leasesEnded += c.leasesEnded
		trials++
	}
	t.Logf("restore: trials=%d stale-writes-applied=%d writes-refused-after-regression=%d stale-candidates=%d old-owner-leases-restored=%d old-owner-leases-ended=%d",
		trials, sum.staleApplied, sum.refused, sum.candidates, sum.leasesRestored, sum.leasesEnded)
	if sum.staleApplied != 0 {
		t.Fatalf("%d stale compare-and-swaps were applied after a restore", sum.staleApplied)
	}
	if sum.candidates == 0 {
		t.Fatal("no held version named another row state after the plain restores: the test proved nothing")
	}
	if sum.leasesEnded != trials {
		t.Fatalf("%d of %d owner leases from before the restore ended", sum.leasesEnded, trials)
	}
}
