package faults_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdcluster"
	"github.com/zlink-systems/authority/view"
)

// TestViewRelistsAfterCompaction kills the member a view watches through
// (its client knows no other), writes through the others and compacts past
// the view's revision, then restarts the member: the view's feed cannot
// resume (its history is gone), so the view relists, and then answers as
// the store does, consistently.
func TestViewRelistsAfterCompaction(t *testing.T) {
	c, cli := startCluster(t, etcdcluster.Options{})
	const ns = "/faults/view-relist/"
	admin := newStore(t, cli, ns)
	tgt := conformance.Target(conformance.NodeA, conformance.NodeLifecycle, authority.OwnerToken{OwnerID: "relist-owner", LeaseGeneration: 1})
	markLive(t, admin, tgt, ownerTTL)
	h := &conformance.Harness{Store: admin, Now: time.Now, SetLive: func(testing.TB, authority.NodeDescriptor, int64, authority.OwnerToken, bool) {}}
	fx := conformance.NewFixture(t, h)
	for i := range 5 {
		id := fmt.Sprintf("before-%d", i)
		eventually(t, "create "+id, func(ctx context.Context) error {
			_, err := admin.Reserve(ctx, fx.ReserveRequest(authority.ObjectUserSpot, id, tgt))
			return err
		})
	}
	leader, err := c.Leader(settle(t))
	if err != nil {
		t.Fatal(err)
	}
	member := (leader + 1) % c.Size()
	v, err := view.New(settle(t), newStore(t, c.MemberClient(t, member), ns), view.Config{Prefix: "user_spot/", MaxWait: time.Second})
	if err != nil {
		t.Fatalf("view: %v", err)
	}
	t.Cleanup(func() { _ = v.Close() })
	before := v.Revision()

	if err := c.Kill(member); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		id := fmt.Sprintf("during-%d", i)
		eventually(t, "create "+id, func(ctx context.Context) error {
			_, err := admin.Reserve(ctx, fx.ReserveRequest(authority.ObjectUserSpot, id, tgt))
			return err
		})
	}
	eventually(t, "compact", func(ctx context.Context) error {
		resp, err := cli.Get(ctx, "/faults/view-relist-probe")
		if err == nil {
			_, err = cli.Compact(ctx, resp.Header.Revision)
		}
		return wrapTransient(err)
	})
	if err := c.Restart(member); err != nil {
		t.Fatal(err)
	}
	waitHealthy(t, c)
	ctx := settle(t)
	for v.Relists() == 0 {
		if ctx.Err() != nil {
			t.Fatalf("the view never relisted (revision %d, was %d; stats %+v)", v.Revision(), before, v.Stats())
		}
		time.Sleep(20 * time.Millisecond)
	}
	want := fx.ListAll("user_spot/", authority.MaxScanLimit)
	var got []authority.ScanItem
	eventually(t, "list from the view", func(ctx context.Context) error {
		p, err := v.List(ctx, "user_spot/", "", authority.MaxScanLimit, view.Freshness{})
		got = p.Items
		return wrapTransient(err)
	})
	if len(got) != len(want) || len(want) != 10 {
		t.Fatalf("the view lists %d rows, the store %d (want 10)", len(got), len(want))
	}
	for i := range want {
		conformance.RequireSameRow(t, want[i].Snapshot, got[i].Snapshot)
	}
	t.Logf("view relisted: revision %d → %d, stats %+v", before, v.Revision(), v.Stats())
}

// wrapTransient marks a raw etcd client error as transient for eventually.
func wrapTransient(err error) error {
	if err == nil {
		return nil
	}
	return authority.Wrap(authority.ErrUnavailable, "etcd", err)
}
