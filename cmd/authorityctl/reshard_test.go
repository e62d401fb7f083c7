package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/sharded"
)

// clustersFileFor writes a --clusters file naming the namespaces of shards
// (the map in force) and add, all on the test cluster.
func clustersFileFor(t *testing.T, shards []string, add string) string {
	t.Helper()
	body := "shards:\n"
	for _, ns := range shards {
		body += fmt.Sprintf("  - endpoints: [%s]\n    namespace: %s\n", testEndpoint, ns)
	}
	body += fmt.Sprintf("add:\n  endpoints: [%s]\n  namespace: %s\n", testEndpoint, add)
	path := filepath.Join(t.TempDir(), "clusters.yaml")
	require.NoError(t, os.WriteFile(path, []byte(body), 0o600))
	return path
}

// TestShardsCommands: shards add moves a one-shard namespace's rows into a
// second namespace and switches the map (the store that was open on one
// shard follows it); status then shows the job done; a second add of a
// namespace that holds rows is refused; pause, resume and abort without
// --yes are usage errors; a --clusters file with an unknown field too.
func TestShardsCommands(t *testing.T) {
	ctx := context.Background()
	stamp := time.Now().UnixNano()
	src, dst := fmt.Sprintf("/shards-%d-a/", stamp), fmt.Sprintf("/shards-%d-b/", stamp)
	defer func() {
		for _, ns := range []string{src, dst} {
			_, _ = testClient.Delete(ctx, ns, clientv3.WithPrefix())
		}
	}()
	s, err := sharded.New(ctx, sharded.Config{
		Shards: []etcdstore.Config{{Client: testClient, Namespace: src}},
		Spares: []etcdstore.Config{{Client: testClient, Namespace: dst}},
	})
	require.NoError(t, err)
	defer func() { _ = s.Close() }()
	h := &conformance.Harness{Store: s, Now: time.Now,
		SetLive: func(t testing.TB, node authority.NodeDescriptor, lc int64, owner authority.OwnerToken, live bool) {
			require.NoError(t, s.MarkLive(ctx, node, lc, owner, time.Minute))
		}}
	fx := conformance.NewFixture(t, h)
	for i := range 30 {
		fx.Active(authority.ObjectUserSpot, fmt.Sprintf("room-%d", i), conformance.TargetA)
	}
	file := clustersFileFor(t, []string{src}, dst)

	_, errOut, code := cli(t, nil, "shards", "add", "--clusters", file)
	require.Equal(t, exitUsage, code, errOut)
	require.Contains(t, errOut, "--yes")
	out, errOut, code := cli(t, nil, "shards", "add", "--clusters", file, "--yes", "-o", "json")
	require.Equal(t, exitOK, code, errOut)
	var v shardsView
	require.NoError(t, json.Unmarshal([]byte(out), &v))
	require.Equal(t, "done", v.Phase)
	require.Equal(t, int64(2), v.ToEpoch)
	require.Positive(t, v.Rows)
	require.Contains(t, errOut, "shards: ", "progress on stderr")

	out, errOut, code = cli(t, nil, "shards", "status", "--clusters", file)
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "done")
	require.Contains(t, out, "1→2")
	for i := range 30 {
		fx.MustRow(fx.Key(authority.ObjectUserSpot, fmt.Sprintf("room-%d", i)))
	}
	require.Equal(t, 2, s.Shards())

	// the map is now two shards: adding the same namespace again is refused
	_, errOut, code = cli(t, nil, "shards", "add", "--clusters", clustersFileFor(t, []string{src, dst}, dst), "--yes")
	require.Equal(t, exitFailure, code, errOut)
	for _, c := range []string{"pause", "resume", "abort"} {
		_, errOut, code = cli(t, nil, "shards", c, "--clusters", file)
		require.Equal(t, exitUsage, code, errOut)
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	require.NoError(t, os.WriteFile(bad, []byte("shards: []\nextra: 1\n"), 0o600))
	_, errOut, code = cli(t, nil, "shards", "status", "--clusters", bad)
	require.Equal(t, exitUsage, code, errOut)
	require.Contains(t, errOut, "extra")
}

// clustersOnNamespace writes a --clusters file whose clusters take the
// global --namespace (no namespace of their own).
func clustersOnNamespace(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "clusters.yaml")
	body := fmt.Sprintf("shards:\n  - endpoints: [%s]\nadd:\n  endpoints: [%s]\n", testEndpoint, testEndpoint)
	require.NoError(t, os.WriteFile(path, []byte(body), 0o600))
	return path
}
