package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/etcd/storeversion"
)

// TestUpgradeCommands: status lists an earlier build's owner; finalize is
// blocked by it (exit 1, named), dry-run and --yes move nothing then; once
// it is gone, --dry-run says what would move and --yes moves it.
func TestUpgradeCommands(t *testing.T) {
	ctx := context.Background()
	ns := fmt.Sprintf("/upgrade-%d/", time.Now().UnixNano())
	defer func() { _, _ = testClient.Delete(ctx, ns, clientv3.WithPrefix()) }()
	// an earlier build's namespace (a key of its, no active version) and
	// owner: a liveness key on a lease with no announcement
	_, err := testClient.Put(ctx, schema.NewLayout(ns).OwnerGen("earlier-owner"), schema.EncodeOwnerGeneration(1))
	require.NoError(t, err)
	grant, err := testClient.Grant(ctx, 60)
	require.NoError(t, err)
	defer func() { _, _ = testClient.Revoke(ctx, grant.ID) }()
	node := authority.NodeDescriptor{MeshName: "m", RID: "old"}
	owner := authority.OwnerToken{OwnerID: "earlier-owner", LeaseGeneration: 1}
	live := schema.Liveness{MeshName: "m", RID: "old", Lifecycle: 1, OwnerID: owner.OwnerID, Lease: 1}
	_, err = testClient.Put(ctx, schema.NewLayout(ns).Liveness(node, 1, owner), live.Encode(), clientv3.WithLease(grant.ID))
	require.NoError(t, err)

	out, errOut, code := cli(t, nil, on(ns, "upgrade", "status", "-o", "json")...)
	require.Equal(t, 0, code, errOut)
	var v upgradeView
	require.NoError(t, json.Unmarshal([]byte(out), &v))
	require.EqualValues(t, storeversion.Base, v.Active)
	require.EqualValues(t, storeversion.Base, v.Ceiling)
	require.Len(t, v.Processes, 1)
	require.False(t, v.Processes[0].Announced)
	require.Equal(t, []string{"earlier-owner/1"}, v.Processes[0].Owners)

	_, errOut, code = cli(t, nil, on(ns, "upgrade", "finalize")...)
	require.Equal(t, exitUsage, code, "finalize without --yes or --dry-run")
	require.Contains(t, errOut, "--yes or --dry-run")
	_, errOut, code = cli(t, nil, on(ns, "upgrade", "finalize", "--dry-run", "--to", "99")...)
	require.Equal(t, exitUsage, code, errOut)

	out, errOut, code = cli(t, nil, on(ns, "upgrade", "finalize", "--yes")...)
	require.Equal(t, exitFailure, code)
	require.Contains(t, errOut, "cannot move to store version")
	require.Contains(t, errOut, "earlier-owner")
	require.Contains(t, out, "node m/old@1", "the table names the earlier build's node")

	_, err = testClient.Revoke(ctx, grant.ID)
	require.NoError(t, err)
	out, errOut, code = cli(t, nil, on(ns, "upgrade", "finalize", "--dry-run")...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, fmt.Sprintf("would move the active version from 1 to %d", storeversion.Latest))
	out, errOut, code = cli(t, nil, on(ns, "upgrade", "finalize", "--yes")...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, fmt.Sprintf("finalized: active store version moved from 1 to %d", storeversion.Latest))
	out, _, code = cli(t, nil, on(ns, "upgrade", "status", "-o", "json")...)
	require.Equal(t, 0, code)
	require.NoError(t, json.Unmarshal([]byte(out), &v))
	require.EqualValues(t, storeversion.Latest, v.Active)
}

// earlierBuildOwner makes an owner live on node m/old the way a build
// before announcements does: a liveness key on a lease with no
// announcement. It returns the lease, revoked at t's cleanup.
func earlierBuildOwner(t *testing.T, ns string) clientv3.LeaseID {
	t.Helper()
	ctx := context.Background()
	grant, err := testClient.Grant(ctx, 60)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = testClient.Revoke(context.Background(), grant.ID) })
	node := authority.NodeDescriptor{MeshName: "m", RID: "old"}
	owner := authority.OwnerToken{OwnerID: "earlier-owner", LeaseGeneration: 1}
	live := schema.Liveness{MeshName: "m", RID: "old", Lifecycle: 1, OwnerID: owner.OwnerID, Lease: 1}
	_, err = testClient.Put(ctx, schema.NewLayout(ns).Liveness(node, 1, owner), live.Encode(), clientv3.WithLease(grant.ID))
	require.NoError(t, err)
	return grant.ID
}

// TestEarlierBuildAfterFinalizeFails: a live owner of an earlier build on a
// finalized namespace is a failure of upgrade status and doctor (exit 1),
// naming the owner and its node, in every output format.
func TestEarlierBuildAfterFinalizeFails(t *testing.T) {
	ctx := context.Background()
	ns := fmt.Sprintf("/finalized-%d/", time.Now().UnixNano())
	defer func() { _, _ = testClient.Delete(ctx, ns, clientv3.WithPrefix()) }()
	_, err := testClient.Put(ctx, schema.NewLayout(ns).ActiveVersion(), schema.EncodeActiveVersion(storeversion.Latest))
	require.NoError(t, err)
	earlierBuildOwner(t, ns)

	for _, format := range []string{"table", "json"} {
		out, errOut, code := cli(t, nil, on(ns, "upgrade", "status", "-o", format)...)
		require.Equal(t, exitFailure, code, "upgrade status -o %s: %s%s", format, out, errOut)
		require.Contains(t, errOut, "earlier-owner")
		require.Contains(t, errOut, "m/old")
		require.NotContains(t, out, "every live process supports up to 1")
		if format == "json" {
			var v upgradeView
			require.NoError(t, json.Unmarshal([]byte(out), &v), "stdout stays one JSON document")
			require.Len(t, v.Incompatible, 1)
		}
	}
	out, errOut, code := cli(t, nil, on(ns, "doctor", "--no-probe")...)
	require.Equal(t, exitFailure, code, "doctor: %s%s", out, errOut)
	var line string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "store versions") {
			line = l
		}
	}
	require.Contains(t, line, checkFail)
	require.Contains(t, line, "earlier-owner")
	require.Contains(t, line, "m/old")
	require.NotContains(t, line, "pid 0")
	require.NotContains(t, line, "finalize waits")
	t.Logf("doctor: %s", line)
}

// TestBlockedFinalizeSaysItOnce: a finalize blocked by an earlier build's
// owner names it once (on stderr, not also on stdout), with the time its
// lease has left and what to do.
func TestBlockedFinalizeSaysItOnce(t *testing.T) {
	ctx := context.Background()
	ns := fmt.Sprintf("/blocked-%d/", time.Now().UnixNano())
	defer func() { _, _ = testClient.Delete(ctx, ns, clientv3.WithPrefix()) }()
	_, err := testClient.Put(ctx, schema.NewLayout(ns).OwnerGen("earlier-owner"), schema.EncodeOwnerGeneration(1))
	require.NoError(t, err)
	earlierBuildOwner(t, ns)
	for _, mode := range []string{"--yes", "--dry-run"} {
		out, errOut, code := cli(t, nil, on(ns, "upgrade", "finalize", mode)...)
		require.Equal(t, exitFailure, code, "finalize %s: %s%s", mode, out, errOut)
		require.Equal(t, 1, strings.Count(out+errOut, "owner earlier-owner generation 1"), "the blocker is named once: stdout %q, stderr %q", out, errOut)
		require.Regexp(t, `lease [0-9a-f]+, (\d+m)?\d+s left`, errOut)
		require.Contains(t, errOut, "run finalize again")
		t.Logf("finalize %s:\n%s%s", mode, out, errOut)
	}
}
