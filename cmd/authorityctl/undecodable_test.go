package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestUndecodableKeysAreNamedAndSkipped copies the golden namespace and
// writes a foreign value over one row, one owner liveness key and one
// capacity entry: list, owners and capacity show every decodable entry, name
// each bad key on stderr and exit 1; get of a good row works, get of the bad
// one names it; doctor fails its keys check naming all three; watch names
// the bad row.
func TestUndecodableKeysAreNamedAndSkipped(t *testing.T) {
	ctx := context.Background()
	const ns = "/undecodable/"
	all, err := testClient.Get(ctx, goldenNS, clientv3.WithPrefix())
	require.NoError(t, err)
	segments := []string{"rows/user_spot/room-1", "owners/owner-a/", "capacity/demo/node-b/"}
	bad := make([]string, len(segments)) // the key overwritten under each segment
	for _, kv := range all.Kvs {
		key := ns + strings.TrimPrefix(string(kv.Key), goldenNS)
		value := string(kv.Value)
		for i, seg := range segments {
			if strings.HasPrefix(key, ns+seg) && bad[i] == "" {
				value = "not a value of this store"
				bad[i] = key
			}
		}
		_, err := testClient.Put(ctx, key, value)
		require.NoError(t, err)
	}
	for i, k := range bad {
		require.NotEmpty(t, k, "no key under %s", segments[i])
	}
	t.Cleanup(func() { _, _ = testClient.Delete(context.Background(), ns, clientv3.WithPrefix()) })

	golden := func(args ...string) int {
		out, _, code := cli(t, nil, on(goldenNS, args...)...)
		require.Equal(t, exitOK, code)
		return strings.Count(out, "\n")
	}
	for _, tc := range []struct {
		args []string
		bad  string
	}{
		{[]string{"list"}, bad[0]},
		{[]string{"owners"}, bad[1]},
		{[]string{"capacity"}, bad[2]},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			out, errOut, code := cli(t, nil, on(ns, tc.args...)...)
			require.Equal(t, exitFailure, code, "stdout: %s\nstderr: %s", out, errOut)
			require.Contains(t, errOut, tc.bad)
			require.Contains(t, errOut, "undecodable keys were left out")
			want := golden(tc.args...)
			if tc.args[0] != "capacity" {
				want-- // the bad row or owner is left out
			}
			require.Equal(t, want, strings.Count(out, "\n"), "every decodable entry is shown:\n%s", out)
		})
	}
	out, errOut, code := cli(t, nil, on(ns, "list", "-o", "json")...)
	require.Equal(t, exitFailure, code, errOut)
	var lv listView
	require.NoError(t, json.Unmarshal([]byte(out), &lv), "stdout stays one JSON document")
	require.NotEmpty(t, lv.Items)

	_, errOut, code = cli(t, nil, on(ns, "get", "user_spot/room-2")...)
	require.Equal(t, exitOK, code, errOut)
	_, errOut, code = cli(t, nil, on(ns, "get", "user_spot/room-1")...)
	require.Equal(t, exitFailure, code)
	require.Contains(t, errOut, bad[0])

	out, _, code = cli(t, nil, on(ns, "doctor", "--no-probe")...)
	require.Equal(t, exitFailure, code)
	for _, k := range bad {
		require.Contains(t, out, k)
	}
	_, errOut, code = cli(t, nil, on(ns, "watch", "user_spot/room-1", "--rev", "1", "--count", "1")...)
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, errOut, bad[0])
}
