package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// leaseIDs lists the server's leases.
func leaseIDs(t *testing.T) []clientv3.LeaseID {
	t.Helper()
	resp, err := testClient.Leases(context.Background())
	require.NoError(t, err)
	ids := make([]clientv3.LeaseID, 0, len(resp.Leases))
	for _, l := range resp.Leases {
		ids = append(ids, l.ID)
	}
	return ids
}

// requireNothingLeft checks that no key is under ns and the server holds
// exactly the leases it held before.
func requireNothingLeft(t *testing.T, ns string, leasesBefore []clientv3.LeaseID) {
	t.Helper()
	requireNoKeys(t, ns)
	require.ElementsMatch(t, leasesBefore, leaseIDs(t), "leases left behind")
}

// The CI smoke test of authorityctl bench: every workload runs for a short
// time, the JSON result has the store phase and, for a workload with a
// baseline of its shape, the baseline and the ratio (none for aggregate and
// mixed), and the run leaves no key and no lease behind.
func TestBench(t *testing.T) {
	for _, w := range benchWorkloads {
		t.Run(w, func(t *testing.T) {
			ns := "/benchtest-" + w + "/"
			before := leaseIDs(t)
			out, errOut, code := cli(t, nil, on(ns, "bench", "--workload", w, "--clients", "4", "--duration", "300ms",
				"--rows", "40", "--payload-bytes", "100", "-o", "json")...)
			require.Equal(t, exitOK, code, errOut)
			var v benchView
			require.NoError(t, json.Unmarshal([]byte(out), &v), out)
			require.Equal(t, w, v.Workload)
			require.Equal(t, 4, v.Clients)
			require.True(t, strings.HasPrefix(v.Namespace, ns+"bench-"), v.Namespace)
			withBaseline := w != workloadAggregate && w != workloadMixed
			require.NotNil(t, v.Store)
			phases := map[string]*phaseView{"store": v.Store}
			if withBaseline {
				require.NotNil(t, v.Baseline)
				require.NotNil(t, v.Ratio)
				require.NotEmpty(t, v.BaselineShape)
				phases["baseline"] = v.Baseline
				require.InDelta(t, v.Store.OpsPerSec/v.Baseline.OpsPerSec, *v.Ratio, 1e-9)
			} else {
				require.Nil(t, v.Baseline, "no raw op has the shape of %s", w)
				require.Nil(t, v.Ratio)
				require.NotContains(t, out, `"ratio"`)
			}
			for name, p := range phases {
				require.Positive(t, p.Ops, name)
				require.InDelta(t, float64(p.Ops)/p.Seconds, p.OpsPerSec, 1e-6*p.OpsPerSec, name)
				require.Positive(t, p.P50Ms, name)
				require.True(t, p.P50Ms <= p.P90Ms && p.P90Ms <= p.P99Ms && p.P99Ms <= p.P999Ms && p.P999Ms <= p.MaxMs*1.001,
					"%s percentiles out of order: %+v", name, p)
			}
			// the rows and the owners were there
			require.GreaterOrEqual(t, v.Cleanup.KeysDeleted, int64(40+2))
			require.Positive(t, v.Cleanup.LeasesRevoked, "the owner leases")
			require.Contains(t, errOut, "bench: ", "plain progress lines when stderr is not a terminal")
			requireNothingLeft(t, ns, before)
		})
	}
}

// The table output names both phases and prints the ratio and the cleanup.
func TestBenchTable(t *testing.T) {
	ns := "/benchtest-table/"
	before := leaseIDs(t)
	out, errOut, code := cli(t, nil, on(ns, "bench", "--workload", "cas", "--clients", "2", "--duration", "200ms", "--rows", "5")...)
	require.Equal(t, exitOK, code, errOut)
	for _, want := range []string{"workload cas, 2 clients", "PHASE", "P99.9", "\ncas ", "\nraw etcd ", "ratio store/baseline: ", "Txn: put a", "cleanup: "} {
		require.Contains(t, out, want)
	}
	requireNothingLeft(t, ns, before)
}

// A namespace holding keys is refused without --yes and nothing is written;
// with --yes the bench runs next to the keys and leaves them alone.
func TestBenchRefusesHeldNamespace(t *testing.T) {
	ns := "/benchtest-held/"
	ctx := context.Background()
	_, err := testClient.Put(ctx, ns+"someone-else", "v")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = testClient.Delete(ctx, ns, clientv3.WithPrefix()) })
	before := leaseIDs(t)
	_, errOut, code := cli(t, nil, on(ns, "bench", "--workload", "cas", "--duration", "200ms")...)
	require.Equal(t, exitFailure, code)
	require.Contains(t, errOut, "holds 1 keys")
	require.Contains(t, errOut, "--yes")
	all, err := testClient.Get(ctx, ns, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	require.NoError(t, err)
	require.Len(t, all.Kvs, 1, "nothing written")
	require.ElementsMatch(t, before, leaseIDs(t))

	_, errOut, code = cli(t, nil, on(ns, "bench", "--workload", "cas", "--clients", "2", "--duration", "200ms", "--rows", "4", "--yes")...)
	require.Equal(t, exitOK, code, errOut)
	all, err = testClient.Get(ctx, ns, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	require.NoError(t, err)
	require.Len(t, all.Kvs, 1, "only the key that was there")
	require.ElementsMatch(t, before, leaseIDs(t))
}

// Bad flags are usage errors naming the flag, and nothing is written.
func TestBenchBadFlags(t *testing.T) {
	ns := "/benchtest-bad/"
	before := leaseIDs(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "--workload"},
		{[]string{"--workload", "nope"}, `--workload "nope"`},
		{[]string{"--workload", "cas", "--clients", "0"}, "--clients 0 is out of range"},
		{[]string{"--workload", "cas", "--clients", "5000"}, "--clients 5000 is out of range"},
		{[]string{"--workload", "cas", "--duration", "1ms"}, "--duration 1ms is out of range"},
		{[]string{"--workload", "cas", "--duration", "-5s"}, "--duration -5s is out of range"},
		{[]string{"--workload", "list", "--rows", "0"}, "--rows 0 is out of range"},
		{[]string{"--workload", "cas", "--payload-bytes", "-1"}, "--payload-bytes -1 is out of range"},
		{[]string{"--workload", "cas", "--payload-bytes", "99999999"}, "--payload-bytes 99999999 is out of range"},
		{[]string{"--workload", "cas", "--clients", "x"}, "invalid argument"},
		{[]string{"--workload", "cas", "extra"}, "accepts 0 arg"},
	} {
		_, errOut, code := cli(t, nil, on(ns, append([]string{"bench"}, tc.args...)...)...)
		require.Equal(t, exitUsage, code, "%v: %s", tc.args, errOut)
		require.Contains(t, errOut, tc.want, "%v", tc.args)
	}
	requireNothingLeft(t, ns, before)
}

// Ctrl-C in the middle of a phase still deletes every key and lease.
func TestBenchInterruptedCleansUp(t *testing.T) {
	ns := "/benchtest-interrupt/"
	before := leaseIDs(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		// stop once the workload is running: its rows are written
		for ctx.Err() == nil {
			resp, err := testClient.Get(ctx, ns, clientv3.WithPrefix(), clientv3.WithCountOnly())
			if err == nil && resp.Count > 20 {
				time.Sleep(300 * time.Millisecond)
				cancel()
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	out, errOut, code := cliBounded(t, ctx, time.Minute, on(ns, "bench", "--workload", "reserve-commit", "--clients", "4",
		"--duration", "10m", "--rows", "10", "-o", "json")...)
	require.Equal(t, exitInterrupted, code, errOut)
	require.Contains(t, errOut, "stopped by a signal")
	require.Contains(t, errOut, "bench: cleaned up: ", "it says it cleaned up")
	var v benchView
	require.NoError(t, json.Unmarshal([]byte(out), &v), "the partial result, as JSON: %s", out)
	require.True(t, v.Interrupted)
	require.NotNil(t, v.Store, "the phase measured until Ctrl-C")
	require.Positive(t, v.Store.Ops)
	require.Nil(t, v.Baseline)
	require.Positive(t, v.Cleanup.KeysDeleted)
	requireNothingLeft(t, ns, before)
}
