package main

import (
	"context"
	"encoding/json"
	"fmt"
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
	require.Contains(t, out, "blocked by")
	require.Contains(t, out+errOut, "earlier-owner")

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
