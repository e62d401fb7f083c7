package etcd_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/stretchr/testify/require"
	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/etcd/storeversion"
)

// earlierBuildNamespace returns a namespace an earlier build already wrote
// to (a key of its, no active-version key): it stays at Base.
func earlierBuildNamespace(t *testing.T) string {
	t.Helper()
	ns := etcdtest.Namespace()
	gen := schema.NewLayout(ns).OwnerGen("earlier")
	if _, err := shared.Put(context.Background(), gen, schema.EncodeOwnerGeneration(1)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = shared.Delete(context.Background(), ns, clientv3.WithPrefix()) })
	return ns
}

// earlierBuildOwner makes an owner live the way a build before
// announcements did: a liveness key on a lease with no announcement. It
// returns the lease.
func earlierBuildOwner(t *testing.T, ns string) clientv3.LeaseID {
	t.Helper()
	node := authority.NodeDescriptor{MeshName: "mesh", RID: "old-node"}
	owner := authority.OwnerToken{OwnerID: "old-owner", LeaseGeneration: 1}
	live := schema.Liveness{MeshName: node.MeshName, RID: node.RID, Lifecycle: 1, OwnerID: owner.OwnerID, Lease: 1}
	return putOnLease(t, func(clientv3.LeaseID) (string, string) {
		return schema.NewLayout(ns).Liveness(node, 1, owner), live.Encode()
	})
}

// putOnLease puts the key and value kv names on a new lease of a minute,
// revoked at t's cleanup, and returns the lease.
func putOnLease(t *testing.T, kv func(clientv3.LeaseID) (key, value string)) clientv3.LeaseID {
	t.Helper()
	ctx := context.Background()
	grant, err := shared.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = shared.Revoke(context.Background(), grant.ID) })
	key, value := kv(grant.ID)
	if _, err := shared.Put(ctx, key, value, clientv3.WithLease(grant.ID)); err != nil {
		t.Fatal(err)
	}
	return grant.ID
}

func TestEmptyNamespaceStartsAtLatest(t *testing.T) {
	s := newStore(t, nil, etcdstore.Config{})
	if got := s.ActiveVersion(); got != storeversion.Latest {
		t.Fatalf("a new namespace is at %s, want %s", got, storeversion.Latest)
	}
	u, err := s.UpgradeStatus(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if u.Active != storeversion.Latest || len(u.Announced) != 1 || len(u.Unannounced) != 0 {
		t.Fatalf("status %+v, want Latest and this store's announcement", u)
	}
	a := u.Announced[0]
	if a.Role != "store" || a.Min != int32(storeversion.MinSupported) || a.Max != int32(storeversion.Latest) || a.Build == "" {
		t.Fatalf("announcement %+v", a.Announcement)
	}
}

func TestEarlierNamespaceStaysAtBaseUntilFinalized(t *testing.T) {
	ctx := context.Background()
	ns := earlierBuildNamespace(t)
	s1 := newStore(t, nil, etcdstore.Config{Namespace: ns})
	s2 := newStore(t, nil, etcdstore.Config{Namespace: ns, Role: "second"})
	if s1.ActiveVersion() != storeversion.Base || s2.ActiveVersion() != storeversion.Base {
		t.Fatalf("a namespace an earlier build wrote is at %s/%s, want Base", s1.ActiveVersion(), s2.ActiveVersion())
	}
	dry, err := s1.Finalize(ctx, storeversion.Latest, true)
	if err != nil || dry.Moved || dry.To != storeversion.Latest || len(dry.Status.Announced) != 2 {
		t.Fatalf("dry run: %+v, %v", dry, err)
	}
	if v, _ := etcdstore.ReadUpgradeStatus(ctx, shared, ns); v.Active != storeversion.Base {
		t.Fatalf("a dry run moved the version to %s", v.Active)
	}
	res, err := s1.Finalize(ctx, storeversion.Latest, false)
	if err != nil || !res.Moved || res.From != storeversion.Base || res.To != storeversion.Latest {
		t.Fatalf("finalize: %+v, %v", res, err)
	}
	if s1.ActiveVersion() != storeversion.Latest {
		t.Fatalf("the finalizing store works at %s", s1.ActiveVersion())
	}
	waitFor(t, "the other store to follow the finalize", func() bool { return s2.ActiveVersion() == storeversion.Latest })
	// finalize is idempotent and never moves back
	again, err := s2.Finalize(ctx, storeversion.Base, false)
	if err != nil || again.Moved || again.To != storeversion.Latest {
		t.Fatalf("finalize back to Base: %+v, %v", again, err)
	}
}

func TestFinalizeWaitsForUnannouncedOwner(t *testing.T) {
	ctx := context.Background()
	ns := earlierBuildNamespace(t)
	lease := earlierBuildOwner(t, ns)
	s := newStore(t, nil, etcdstore.Config{Namespace: ns})
	u, err := s.UpgradeStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(u.Unannounced) != 1 || u.Unannounced[0].Owner.OwnerID != "old-owner" || u.Ceiling() != storeversion.Base {
		t.Fatalf("status %+v: want the earlier build's owner, ceiling Base", u)
	}
	for _, dry := range []bool{true, false} {
		_, err := s.Finalize(ctx, storeversion.Latest, dry)
		if !errors.Is(err, etcdstore.ErrFinalizeBlocked) || !strings.Contains(err.Error(), "old-owner") {
			t.Fatalf("finalize (dry %v) with an earlier build's owner live: %v", dry, err)
		}
	}
	if s.ActiveVersion() != storeversion.Base {
		t.Fatal("a blocked finalize moved the version")
	}
	if _, err := shared.Revoke(ctx, lease); err != nil {
		t.Fatal(err)
	}
	if res, err := s.Finalize(ctx, storeversion.Latest, false); err != nil || !res.Moved {
		t.Fatalf("finalize once the earlier owner is gone: %+v, %v", res, err)
	}
}

func TestFinalizeWaitsForOlderAnnouncedBuild(t *testing.T) {
	ctx := context.Background()
	ns := earlierBuildNamespace(t)
	s := newStore(t, nil, etcdstore.Config{Namespace: ns})
	lease := announceOlder(t, ns)
	_, err := s.Finalize(ctx, storeversion.Latest, false)
	if !errors.Is(err, etcdstore.ErrFinalizeBlocked) || !strings.Contains(err.Error(), "older-build") {
		t.Fatalf("finalize past a live older build: %v", err)
	}
	if _, err := shared.Revoke(ctx, lease); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Finalize(ctx, storeversion.Latest, false); err != nil {
		t.Fatal(err)
	}
}

// announceOlder announces a process that works at Base only, on a lease of
// its own, and returns the lease.
func announceOlder(t *testing.T, ns string) clientv3.LeaseID {
	t.Helper()
	a := schema.Announcement{Build: "older-build", Role: "store", Host: "h", PID: 1, Min: 1, Max: 1, Started: time.Now()}
	return putOnLease(t, func(id clientv3.LeaseID) (string, string) {
		return schema.NewLayout(ns).Announcement(int64(id)), a.Encode()
	})
}

// TestFinalizeFencedOnAnnouncements: a process that announces between
// finalize's read and its Txn fails the Txn, and the next read sees it.
func TestFinalizeFencedOnAnnouncements(t *testing.T) {
	ctx := context.Background()
	for _, racer := range []string{"announcement", "owner"} {
		t.Run(racer, func(t *testing.T) {
			ns := earlierBuildNamespace(t)
			s := newStore(t, nil, etcdstore.Config{Namespace: ns})
			raced := false
			_, err := etcdstore.FinalizeRacing(ctx, shared, ns, storeversion.Latest, func() {
				if !raced {
					raced = true
					if racer == "announcement" {
						announceOlder(t, ns)
					} else {
						earlierBuildOwner(t, ns)
					}
				}
			})
			if !errors.Is(err, etcdstore.ErrFinalizeBlocked) {
				t.Fatalf("finalize raced by an older %s: %v", racer, err)
			}
			if u, _ := s.UpgradeStatus(ctx); u.Active != storeversion.Base {
				t.Fatalf("the version moved to %s past a process that announced during finalize", u.Active)
			}
		})
	}
}

func TestLaterVersionRefusedAtStart(t *testing.T) {
	ctx := context.Background()
	ns := etcdtest.Namespace()
	t.Cleanup(func() { _, _ = shared.Delete(context.Background(), ns, clientv3.WithPrefix()) })
	later := storeversion.Latest + 7
	if _, err := shared.Put(ctx, schema.NewLayout(ns).ActiveVersion(), schema.EncodeActiveVersion(later)); err != nil {
		t.Fatal(err)
	}
	s, err := etcdstore.New(ctx, etcdstore.Config{Client: shared, Namespace: ns})
	if err == nil {
		_ = s.Close()
		t.Fatal("a store started on a namespace finalized past its build")
	}
	if !errors.Is(err, etcdstore.ErrVersionSkew) {
		t.Fatalf("got %v, want ErrVersionSkew", err)
	}
	for _, want := range []string{later.String(), storeversion.Latest.String(), "run a build that supports"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	// it wrote nothing that stays: its announcement's lease is revoked
	u, err := etcdstore.ReadUpgradeStatus(ctx, shared, ns)
	if err != nil || len(u.Announced) != 0 {
		t.Fatalf("a refused store left %+v (%v)", u.Announced, err)
	}
}

func TestRunningStoreRefusesOnceFinalizedPastIt(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, nil, etcdstore.Config{})
	later := storeversion.Latest + 1
	if _, err := shared.Put(ctx, schema.NewLayout(s.Namespace()).ActiveVersion(), schema.EncodeActiveVersion(later)); err != nil {
		t.Fatal(err)
	}
	key := authority.Key("actor/x")
	waitFor(t, "the store to refuse requests", func() bool {
		_, err := s.ReadAuthority(ctx, key)
		return errors.Is(err, etcdstore.ErrVersionSkew)
	})
}

func TestOwnerLeasesAreAnnounced(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, nil, etcdstore.Config{})
	node := authority.NodeDescriptor{MeshName: "mesh", RID: "n1"}
	l, err := s.Registry().Acquire(ctx, node, 1, "owner-a", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close(ctx) }()
	if err := s.MarkLive(ctx, node, 2, authority.OwnerToken{OwnerID: "owner-b", LeaseGeneration: 1}, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	u, err := s.UpgradeStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(u.Unannounced) != 0 || len(u.Announced) != 3 {
		t.Fatalf("status %+v: want the store's lease and both owners' announced", u)
	}
	owners := 0
	for _, a := range u.Announced {
		owners += len(a.Owners)
	}
	if owners != 2 {
		t.Fatalf("announced owners %d, want 2", owners)
	}
}

// waitFor polls cond until it holds, failing t after a minute.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestTokenFollowsOwnerIsGated: a new-owner aggregate commit that keeps the
// row's owner gives it a new token while the namespace is at Base (the rule
// every earlier build follows), and keeps it once finalized to
// TokenFollowsOwner.
func TestTokenFollowsOwnerIsGated(t *testing.T) {
	ctx := context.Background()
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, nil, etcdstore.Config{Namespace: earlierBuildNamespace(t), Clock: clock})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	selfMove := func(id string, gen int64) (before, after int64) {
		row := fx.Active(authority.ObjectActor, id, conformance.TargetA)
		req := conformance.AggregateRequest("self-"+id, gen, conformance.TargetA, authority.CapacityVector{Actors: 1},
			conformance.Participant(fx.Key(authority.ObjectActor, id), row.StoreVersion, authority.TransitionNewOwner, []byte("moved")))
		fence := fx.MustPrepare(req)
		res, err := s.CommitAggregate(ctx, fence)
		require.NoError(t, err)
		require.Equal(t, authority.KindCommitted, res.Kind)
		return row.OwnershipToken, fx.MustRow(fx.Key(authority.ObjectActor, id)).OwnershipToken
	}
	before, after := selfMove("at-base", 1)
	require.Greater(t, after, before, "at Base a same-owner new-owner commit takes a new token (the earlier builds' rule)")
	_, err := s.Finalize(ctx, storeversion.TokenFollowsOwner, false)
	require.NoError(t, err)
	before, after = selfMove("finalized", 2)
	require.Equal(t, before, after, "at TokenFollowsOwner the owner keeps its token")
}
