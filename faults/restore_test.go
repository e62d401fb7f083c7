package faults_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/embedded"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
	clientsnapshot "go.etcd.io/etcd/client/v3/snapshot"
)

// restoreRows is how many rows each restore trial updates around the
// snapshot.
const restoreRows = 8

// restoreTrials is 2, or 10 in a soak run (AUTHORITY_SOAK set).
func restoreTrials() int {
	if os.Getenv("AUTHORITY_SOAK") != "" {
		return 10
	}
	return 2
}

// restoreOutcome counts what one trial saw.
type restoreOutcome struct {
	staleApplied   int // a pre-restore version applied by the store that held it
	refused        int // requests the old store refused with ErrClusterRegressed
	reusedVersions int // pre-restore versions a new store could apply to another state
	newWrites      int
}

// An operator restores the cluster from a snapshot taken mid-traffic. A
// plain restore rewinds revisions: the store that saw the later revisions
// refuses every request (ErrClusterRegressed), though a store opened afresh
// could apply a version seen before the restore to another row state. With
// --bump-revision and --mark-compacted (the documented procedure) no
// pre-restore version can name another state: every one of them conflicts.
func TestRestoreFromBackup(t *testing.T) {
	for _, bump := range []bool{false, true} {
		name := map[bool]string{false: "plain", true: "bump-revision+mark-compacted"}[bump]
		t.Run(name, func(t *testing.T) {
			var total restoreOutcome
			for trial := range restoreTrials() {
				o := restoreTrial(t, trial, bump)
				total.staleApplied += o.staleApplied
				total.refused += o.refused
				total.reusedVersions += o.reusedVersions
				total.newWrites += o.newWrites
			}
			t.Logf("restore (%s): trials=%d stale-writes-applied=%d writes-refused-after-regression=%d "+
				"pre-restore-versions-a-new-store-could-reuse=%d post-restore-writes=%d",
				name, restoreTrials(), total.staleApplied, total.refused, total.reusedVersions, total.newWrites)
			require.Zero(t, total.staleApplied, "a store applied a version seen before the restore")
			if bump {
				require.Zero(t, total.reusedVersions, "with --bump-revision a pre-restore version named another state")
			} else {
				require.Positive(t, total.refused, "the old store never noticed the regression")
				require.Positive(t, total.reusedVersions, "the plain restore did not rewind (the test cannot fail)")
			}
		})
	}
}

// restoreTrial runs one snapshot → more writes → restore → probe round.
func restoreTrial(t *testing.T, trial int, bump bool) restoreOutcome {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	addr := freeAddr(t)
	srv, err := embedded.Start(ctx, embedded.Config{Dir: filepath.Join(dir, "before"), ClientAddr: addr, AutoCompactionRetention: "0"})
	require.NoError(t, err)
	ns := fmt.Sprintf("/restore-%d/", trial)
	old, fx := embeddedStore(t, addr, ns)
	target := conformance.Target(conformance.NodeA, conformance.NodeLifecycle, authority.OwnerToken{OwnerID: "owner", LeaseGeneration: 1})
	fx.SetLive(target, true)
	keys := make([]authority.Key, restoreRows)
	versions := make([]authority.StoreVersion, restoreRows)
	for i := range keys {
		id := fmt.Sprintf("spot-%d", i)
		snap := fx.Active(authority.ObjectUserSpot, id, target)
		keys[i], versions[i] = fx.Key(authority.ObjectUserSpot, id), snap.StoreVersion
	}
	update := func(s authority.Store, i int, payload string) (authority.CompareExchangeResult, error) {
		return s.CompareExchangeAuthority(ctx, keys[i], versions[i], authority.Put([]byte(payload)))
	}
	for i := range keys { // traffic before the snapshot
		res, err := update(old, i, "before-snapshot")
		require.NoError(t, err)
		versions[i] = res.Snapshot.StoreVersion
	}
	snapPath := filepath.Join(dir, "backup.db")
	require.NoError(t, takeSnapshot(ctx, addr, snapPath))
	for i := range keys { // traffic the snapshot misses: these versions are lost
		res, err := update(old, i, "after-snapshot")
		require.NoError(t, err)
		versions[i] = res.Snapshot.StoreVersion
	}
	srv.Close()
	restored := filepath.Join(dir, "restored")
	cfg := snapshot.RestoreConfig{
		SnapshotPath: snapPath, Name: "authorityctl", OutputDataDir: restored,
		// the member's own name, peer URL and token: the cluster keeps its ID
		PeerURLs: []string{"http://127.0.0.1:0"}, InitialCluster: "authorityctl=http://127.0.0.1:0",
		InitialClusterToken: "etcd-cluster", SkipHashCheck: false,
	}
	if bump {
		cfg.RevisionBump, cfg.MarkCompacted = 1_000_000, true
	}
	require.NoError(t, snapshot.NewV3(zap.NewNop()).Restore(cfg))
	srv, err = embedded.Start(ctx, embedded.Config{Dir: restored, ClientAddr: addr, AutoCompactionRetention: "0"})
	require.NoError(t, err)
	defer srv.Close()
	var o restoreOutcome
	// the old store still holds the lost versions: every one must be refused
	// (plain: the cluster went back) or conflict (bump: they name nothing)
	for i := range keys {
		res, err := updateUntilServed(ctx, func() (authority.CompareExchangeResult, error) { return update(old, i, "stale") })
		switch {
		case errors.Is(err, etcdstore.ErrClusterRegressed):
			if o.refused == 0 {
				t.Logf("trial %d: the old store refuses: %v", trial, err)
			}
			o.refused++
		case err != nil:
			t.Fatalf("old store, row %d: %v", i, err)
		case res.Kind == authority.KindStored:
			o.staleApplied++
		}
	}
	// a store opened after the restore writes a filler row until the next
	// revision is a row's lost version, then writes that row (its new state
	// now has the lost version) and tries the lost version, as an
	// application still holding it would
	fresh, _ := embeddedStore(t, addr, ns)
	write := func(i int) int64 {
		read, err := fresh.ReadAuthority(ctx, keys[i])
		require.NoError(t, err)
		res, err := fresh.CompareExchangeAuthority(ctx, keys[i], read.Snapshot.StoreVersion, authority.Put([]byte("after-restore")))
		require.NoError(t, err)
		require.Equal(t, authority.KindStored, res.Kind)
		o.newWrites++
		return revisionOf(t, res.Snapshot.StoreVersion)
	}
	filler := restoreRows - 1
	rev := write(filler)
	for i := 0; i < filler; i++ {
		for rev+1 < revisionOf(t, versions[i]) {
			rev = write(filler)
		}
		if rev+1 > revisionOf(t, versions[i]) {
			continue // that revision went to another write
		}
		rev = write(i)
		res, err := fresh.CompareExchangeAuthority(ctx, keys[i], versions[i], authority.Put([]byte("stale")))
		require.NoError(t, err)
		if res.Kind == authority.KindStored {
			o.reusedVersions++ // the lost version named another state, and applied
			rev = revisionOf(t, res.Snapshot.StoreVersion)
		}
	}
	return o
}

// updateUntilServed retries a request that found the restarted server not yet
// serving (ErrUnavailable without a regression).
func updateUntilServed(ctx context.Context, f func() (authority.CompareExchangeResult, error)) (authority.CompareExchangeResult, error) {
	for {
		res, err := f()
		if err == nil || errors.Is(err, etcdstore.ErrClusterRegressed) || !errors.Is(err, authority.ErrUnavailable) || ctx.Err() != nil {
			return res, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// takeSnapshot saves a backup as an operator does (etcdctl snapshot save).
func takeSnapshot(ctx context.Context, addr, path string) error {
	_, err := clientsnapshot.SaveWithVersion(ctx, zap.NewNop(), clientv3.Config{Endpoints: []string{addr}, DialTimeout: 5 * time.Second}, path)
	return err
}

func revisionOf(t *testing.T, v authority.StoreVersion) int64 {
	t.Helper()
	n, err := strconv.ParseInt(string(v), 10, 64)
	require.NoError(t, err)
	return n
}
