package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/stretchr/testify/require"
)

// envRequireEtcdctl makes a missing etcdctl a failure instead of a skip
// (.ci/run sets it after installing Debian's etcd-client).
const envRequireEtcdctl = "AUTHORITY_REQUIRE_ETCDCTL"

// etcdctl returns the path of Debian's etcdctl, skipping the test without
// it (failing it when envRequireEtcdctl is set).
func etcdctl(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("etcdctl")
	if err != nil {
		if os.Getenv(envRequireEtcdctl) != "" {
			t.Fatalf("etcdctl is required (%s is set): %v", envRequireEtcdctl, err)
		}
		t.Skip("etcdctl not installed (Debian package etcd-client)")
	}
	return path
}

// etcdctlRun runs etcdctl against the shared server and returns its stdout.
func etcdctlRun(t *testing.T, bin string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"--endpoints", testEndpoint}, args...)...)
	cmd.Env = append(os.Environ(), "ETCDCTL_API=3")
	var errOut bytes.Buffer
	cmd.Stderr = &errOut
	out, err := cmd.Output()
	require.NoError(t, err, "etcdctl %v: %s", args, errOut.String())
	return string(out)
}

// etcdRevision is the cluster's current revision, as etcdctl reads it.
func etcdRevision(t *testing.T, bin string) int64 {
	t.Helper()
	var resp struct {
		Header struct {
			Revision int64 `json:"revision"`
		} `json:"header"`
	}
	require.NoError(t, json.Unmarshal([]byte(etcdctlRun(t, bin, "get", "/", "-w", "json")), &resp))
	return resp.Header.Revision
}

// writesUnder returns every change etcdctl's watch replays under ns after
// revision from, up to a sentinel key it puts there last (and deletes).
func writesUnder(t *testing.T, bin, ns string, from int64) []string {
	t.Helper()
	sentinel := ns + "~sentinel"
	etcdctlRun(t, bin, "put", sentinel, "x")
	defer etcdctlRun(t, bin, "del", sentinel)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--endpoints", testEndpoint, "watch", "--prefix", fmt.Sprintf("--rev=%d", from+1), ns)
	cmd.Env = append(os.Environ(), "ETCDCTL_API=3")
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	defer func() { cancel(); _ = cmd.Wait() }()
	// etcdctl prints each event as its type, its key and its value, a line each
	var lines []string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if sc.Text() == sentinel {
			return lines[:len(lines)-1] // the sentinel's PUT line
		}
		lines = append(lines, sc.Text())
	}
	t.Fatalf("etcdctl watch ended before the sentinel %s (%v): %q", sentinel, sc.Err(), lines)
	return nil
}

// runUntil runs authorityctl until its stdout contains started (or it ends),
// then stops it as Ctrl-C would.
func runUntil(t *testing.T, started string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errOut syncBuffer
	done := make(chan int, 1)
	go func() { done <- run(ctx, args, &out, &errOut, func(string) string { return "" }) }()
	deadline := time.After(2 * time.Minute)
	for !strings.Contains(out.String(), started) {
		select {
		case code := <-done:
			return out.String(), errOut.String(), code
		case <-deadline:
			cancel()
			<-done
			t.Fatalf("%v printed no %q within 2 minutes: %s %s", args, started, out.String(), errOut.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	cancel()
	code = <-done
	return out.String(), errOut.String(), code
}

// leafCommands returns the command path of every runnable command.
func leafCommands(c *cobra.Command) map[string]*cobra.Command {
	out := map[string]*cobra.Command{}
	for _, sub := range c.Commands() {
		for p, l := range leafCommands(sub) {
			out[p] = l
		}
		if sub.Runnable() && !sub.HasSubCommands() {
			out[strings.TrimPrefix(sub.CommandPath(), "authorityctl ")] = sub
		}
	}
	return out
}

// TestReadOnlyCommandsWriteNothing: every command that does not write (and
// each writing command's --dry-run) leaves an unused namespace empty, as
// etcdctl sees it: no key is left there, and etcd's history holds no change
// under it from before the command to after. Each says on stderr that the
// namespace holds nothing, naming it.
func TestReadOnlyCommandsWriteNothing(t *testing.T) {
	bin := etcdctl(t)
	metrics := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	defer metrics.Close()
	cases := map[string][]string{
		"get":                     {"get", "actor", "no-such-actor"},
		"list":                    {"list"},
		"watch":                   {"watch"},
		"owners":                  {"owners"},
		"capacity":                {"capacity"},
		"capacity NODE":           {"capacity", "m/no-such-node"},
		"terminals":               {"terminals"},
		"aggregates":              {"aggregates"},
		"reservations":            {"reservations"},
		"blobs":                   {"blobs"},
		"doctor":                  {"doctor"},
		"top":                     {"top", "--once", metrics.URL},
		"upgrade status":          {"upgrade", "status"},
		"upgrade finalize":        {"upgrade", "finalize", "--dry-run"},
		"remove-owner":            {"remove-owner", "gone-owner", "--lease-generation", "1", "--dry-run"},
		"prune-epochs":            {"prune-epochs", "--dry-run"},
		"upgrade status -o json":  {"upgrade", "status", "-o", "json"},
		"upgrade finalize -o yml": {"upgrade", "finalize", "--dry-run", "-o", "yaml"},
		"shards status":           {"shards", "status", "--clusters", clustersOnNamespace(t)},
	}
	// every command is here, but those that write without a --dry-run
	for path, c := range leafCommands(newRootCommand(nil, nil, nil)) {
		if _, ok := cases[path]; !ok && (!writes(c) || c.Flags().Lookup("dry-run") != nil) {
			t.Errorf("command %q is read-only (or has --dry-run) but is not checked here", path)
		}
	}
	for name, args := range cases {
		t.Run(name, func(t *testing.T) {
			ns := fmt.Sprintf("/unused-%d/", time.Now().UnixNano())
			before := etcdRevision(t, bin)
			var errOut string
			var code int
			if name == "watch" {
				_, errOut, code = runUntil(t, "REV", on(ns, args...)...)
			} else {
				_, errOut, code = cli(t, nil, on(ns, args...)...)
			}
			t.Logf("exit %d, stderr: %s", code, errOut)
			require.Empty(t, etcdctlRun(t, bin, "get", "--prefix", "--keys-only", ns), "keys left under %s", ns)
			require.Empty(t, writesUnder(t, bin, ns, before), "changes under %s while %v ran", ns, args)
			if name != "top" { // top reads a /metrics endpoint, not etcd
				require.Contains(t, errOut, fmt.Sprintf("namespace %s holds no keys at all", ns))
			}
		})
	}
}
