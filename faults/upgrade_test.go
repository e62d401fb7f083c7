package faults_test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/etcd/storeversion"
)

// upgradeAcksPerStep is how many writes each new process must acknowledge
// before the next step: every step runs under traffic.
const upgradeAcksPerStep = 25

// TestRollingUpgradeFromPreviousRelease runs four nodes of the previous
// release (.ci/previous-release, built from this repository's history)
// against one etcd, rolls them one at a time to this build under traffic,
// back to the previous release (a downgrade before finalize), forward again,
// then finalizes. After each node's process stops its acknowledged writes
// are checked; capacity is polled throughout.
func TestRollingUpgradeFromPreviousRelease(t *testing.T) {
	bins := binaries(t)
	srv := etcdtest.Start(t)
	ns := etcdtest.Namespace()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	nodes := []string{"n1", "n2", "n3", "n4"}
	f := newFleet(t, srv.Endpoint(), ns)
	for _, n := range nodes {
		if r := f.start(n, bins.prev); r != nil {
			t.Fatalf("previous release refused to start: %s", r.Err)
		}
	}
	// the checking store joins once the previous release made the
	// namespace (an empty one would start at this build's newest version)
	for _, n := range nodes {
		f.waitAcks(n, upgradeAcksPerStep)
	}
	st, err := etcdstore.New(ctx, etcdstore.Config{Client: srv.Client(t), Namespace: ns, Role: "upgrade-test"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	// the previous release is the one before the compact format: its
	// namespace is at the version before it, and finalize crosses it
	if st.ActiveVersion() != storeversion.CompactFormat-1 {
		t.Fatalf("a namespace of the previous release is at %s, want %s", st.ActiveVersion(), storeversion.CompactFormat-1)
	}
	capacity := capacityWatch(ctx, st, nodes)
	lost, rolled, downgraded := 0, 0, 0
	roll := func(n, bin string) {
		f.stop(n)
		lost += f.lost(ctx, st, n)
		if r := f.start(n, bin); r != nil {
			t.Fatalf("node %s refused to start: %s", n, r.Err)
		}
		f.waitAcks(n, upgradeAcksPerStep)
	}
	blockedWhileOld := false
	for i, n := range nodes {
		roll(n, bins.cur)
		rolled++
		if i == 1 { // half rolled: finalize must wait for the previous release
			_, err := st.Finalize(ctx, storeversion.Latest, true)
			blockedWhileOld = errors.Is(err, etcdstore.ErrFinalizeBlocked)
			if !blockedWhileOld {
				t.Errorf("finalize with previous-release owners live: %v", err)
			}
		}
	}
	for _, n := range nodes {
		roll(n, bins.prev)
		downgraded++
	}
	for _, n := range nodes {
		roll(n, bins.cur)
		rolled++
	}
	res, err := st.Finalize(ctx, storeversion.Latest, false)
	if err != nil || !res.Moved {
		t.Fatalf("finalize after the roll: %+v, %v", res, err)
	}
	f.waitKept(t, 10) // same-owner moves that keep their token, at the new version
	compactRows := waitRowsOfFormat(t, srv.Client(t), ns, 2, 10)
	placed := waitPlacedRows(t, srv.Client(t), ns, 10)
	// each node once more after finalize: its next lease generation rebinds
	// and removes the previous one's rows, of both layouts
	for _, n := range nodes {
		roll(n, bins.cur)
		rolled++
	}
	f.stopAll()
	for _, n := range nodes {
		lost += f.lost(ctx, st, n)
	}
	cancel()
	most, over := capacity()
	violations, kept := f.tokenViolations()
	f.mu.Lock()
	defer f.mu.Unlock()
	fmt.Printf("upgrade: nodes=%d previous=%.12s rolled=%d downgraded=%d acked=%d lost=%d corrupt=%d refused=%d errors=%d "+
		"over-admitted=%d most-held=%d/%d token-violations=%d tokens-kept-after-finalize=%d finalize-blocked-while-old=%v finalized-to=%d compact-rows=%d placement-key-rows=%d\n",
		len(nodes), bins.prevCommit, rolled, downgraded, f.acked, lost, len(f.corrupt), len(f.refused), len(f.errs),
		over, most, upgradeLimit, violations, kept, blockedWhileOld, res.To, compactRows, placed)
	if lost+len(f.corrupt)+len(f.refused)+over+violations > 0 || len(f.errs) > 0 {
		t.Errorf("corrupt %v; errors %v", f.corrupt, f.errs)
	}
}

// waitKept waits until n same-owner moves at TokenFollowsOwner were
// acknowledged.
func (f *fleet) waitKept(t *testing.T, n int) {
	t.Helper()
	eventuallyTrue(t, "same-owner moves after finalize", func() bool {
		_, kept := f.tokenViolations()
		return kept >= n
	})
}

// TestUpgradeGatePretendNextVersion runs this build next to a build with a
// pretend next version (tag authority_next: a row field and a fence rule):
// finalize waits while a node of this build is live, a node taken back
// before finalize loses nothing, and after finalize this build refuses to
// start with a sentence naming both versions.
func TestUpgradeGatePretendNextVersion(t *testing.T) {
	bins := binaries(t)
	srv := etcdtest.Start(t)
	ns := etcdtest.Namespace()
	ctx := context.Background()
	f := newFleet(t, srv.Endpoint(), ns)
	for _, n := range []string{"n1", "n2"} {
		if r := f.start(n, bins.cur); r != nil {
			t.Fatalf("node %s: %s", n, r.Err)
		}
		f.waitAcks(n, upgradeAcksPerStep)
	}
	st, err := etcdstore.New(ctx, etcdstore.Config{Client: srv.Client(t), Namespace: ns, Role: "upgrade-test"})
	if err != nil {
		t.Fatal(err)
	}
	roll := func(n, bin string) (lost int) {
		f.stop(n)
		lost = f.lost(ctx, st, n)
		if r := f.start(n, bin); r != nil {
			t.Fatalf("node %s: %s", n, r.Err)
		}
		f.waitAcks(n, upgradeAcksPerStep)
		return lost
	}
	lost := roll("n1", bins.next)
	ctl := func(args ...string) (string, error) {
		cmd := exec.Command(bins.ctlNext, append([]string{"--endpoints", srv.Endpoint(), "--namespace", ns}, args...)...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := ctl("upgrade", "finalize", "--yes")
	blocked := err != nil && strings.Contains(out, "blocked")
	if !blocked {
		t.Errorf("finalize to the next version with this build's n2 live: %v\n%s", err, out)
	}
	lost += roll("n1", bins.cur) // downgrade before finalize
	downgradeLost := lost
	lost += roll("n1", bins.next)
	lost += roll("n2", bins.next)
	// the checking store is of this build: it must go before finalize
	st.Close()
	if out, err := ctl("upgrade", "finalize", "--yes"); err != nil || !strings.Contains(out, "finalized") {
		t.Fatalf("finalize with every node at the next version: %v\n%s", err, out)
	}
	waitPretendRows(t, f, srv.Client(t), ns)
	nx, nxRefused := refusedByThisBuild(t, srv.Client(t), ns)
	if nxRefused != nx {
		t.Errorf("this build decoded %d of %d rows with the next version's field", nx-nxRefused, nx)
	}
	r := f.start("n3", bins.cur)
	next := strconv.Itoa(int(storeversion.NextPretend))
	refusedAfter := r != nil && strings.Contains(r.Err, "store version "+next) && strings.Contains(r.Err, "run a build that supports version "+next)
	if !refusedAfter {
		t.Errorf("this build started on a namespace at the next version (refusal: %+v)", r)
	}
	_, err = etcdstore.New(ctx, etcdstore.Config{Client: srv.Client(t), Namespace: ns})
	if !errors.Is(err, etcdstore.ErrVersionSkew) {
		t.Errorf("a store of this build opened a namespace at the next version: %v", err)
	}
	f.stopAll()
	f.mu.Lock()
	defer f.mu.Unlock()
	fmt.Printf("upgrade-gate: finalize-blocked-while-old=%v downgrade-lost=%d lost-before-finalize=%d corrupt=%d refused=%d errors=%d "+
		"nx-rows=%d nx-rows-refused-by-this-build=%d old-refused-after-finalize=%v\n",
		blocked, downgradeLost, lost, len(f.corrupt), len(f.refused), len(f.errs), nx, nxRefused, refusedAfter)
	if lost+len(f.corrupt)+len(f.refused)+len(f.errs) > 0 {
		t.Errorf("corrupt %v; errors %v", f.corrupt, f.errs)
	}
}

// waitPretendRows waits until the next version's nodes wrote rows with the
// pretend field.
func waitPretendRows(t *testing.T, f *fleet, c *clientv3.Client, ns string) {
	t.Helper()
	defer func() {
		if t.Failed() {
			f.mu.Lock()
			t.Logf("node errors: %+v", f.errs[:min(5, len(f.errs))])
			f.mu.Unlock()
		}
	}()
	eventuallyTrue(t, "rows with the next version's field", func() bool {
		rows, _ := refusedByThisBuild(t, c, ns)
		return rows >= 5
	})
}

// refusedByThisBuild decodes every row with the next version's field with
// this build's schema and returns how many it refused as corrupt (all of
// them: a value whose meaning a build cannot know is refused, never
// misread), and how many there are.
func refusedByThisBuild(t *testing.T, c *clientv3.Client, ns string) (rows, refused int) {
	t.Helper()
	resp, err := c.Get(context.Background(), ns+"rows/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		if !schema.RowCarriesPretendField(kv.Value) {
			continue
		}
		rows++
		key := authority.Key(strings.TrimPrefix(string(kv.Key), ns+"rows/"))
		if _, err := schema.DecodeRow(key, kv); errors.Is(err, authority.ErrCorrupt) {
			refused++
		}
	}
	return rows, refused
}

// waitRowsOfFormat waits until at least n rows of the namespace are stored
// in format (schema.RowFormat) and returns how many are.
func waitRowsOfFormat(t *testing.T, c *clientv3.Client, ns string, format, n int) (rows int) {
	t.Helper()
	eventuallyTrue(t, fmt.Sprintf("%d rows of format %d", n, format), func() bool {
		resp, err := c.Get(context.Background(), ns+"rows/", clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		rows = 0
		for _, kv := range resp.Kvs {
			if schema.RowFormat(kv.Value) == format {
				rows++
			}
		}
		return rows >= n
	})
	return rows
}

// waitPlacedRows waits until at least n rows of the namespace are placed by
// their placement key (storeversion.FewerKeys) and returns how many are.
func waitPlacedRows(t *testing.T, c *clientv3.Client, ns string, n int) (rows int) {
	t.Helper()
	eventuallyTrue(t, fmt.Sprintf("%d rows with placement keys", n), func() bool {
		resp, err := c.Get(context.Background(), ns+"rows/", clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		rows = 0
		for _, kv := range resp.Kvs {
			r, err := schema.DecodeRow(authority.Key(strings.TrimPrefix(string(kv.Key), ns+"rows/")), kv)
			if err == nil && r.PlacementKey {
				rows++
			}
		}
		return rows >= n
	})
	return rows
}
