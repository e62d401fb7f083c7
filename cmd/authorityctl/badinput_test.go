package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zlink-systems/authority/internal/embedded"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// cliBounded runs authorityctl like cli, failing the test if it does not
// return within bound (a hang) and turning a panic into a test failure.
func cliBounded(t *testing.T, ctx context.Context, bound time.Duration, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errOut syncBuffer
	done := make(chan int, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				fmt.Fprintf(&errOut, "PANIC: %v", r)
				done <- -1
			}
		}()
		done <- run(ctx, args, &out, &errOut, func(string) string { return "" })
	}()
	select {
	case code = <-done:
	case <-time.After(bound):
		t.Fatalf("authorityctl %s did not return within %s (stderr so far: %s)", strings.Join(args, " "), bound, errOut.String())
	}
	require.NotContains(t, errOut.String(), "PANIC", "authorityctl %s", strings.Join(args, " "))
	return out.String(), errOut.String(), code
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// silentEndpoint accepts TCP connections and never answers: a member that
// hangs, or a port that is not etcd's.
func silentEndpoint(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return l.Addr().String()
}

// TestBadInput drives every bad input the operator issue found and asserts
// the exit code and message, with no panic and no hang.
func TestBadInput(t *testing.T) {
	silent := silentEndpoint(t)
	cases := []struct {
		name     string
		args     []string
		code     int
		contains []string
	}{
		// numeric flags: range checked, the range in the message, exit 2
		{"doctor max-txn-ops negative", on("/bad/", "doctor", "--max-txn-ops", "-1"), exitUsage, []string{"--max-txn-ops -1 is out of range", "8..65536"}},
		{"doctor max-txn-ops zero", on("/bad/", "doctor", "--max-txn-ops", "0"), exitUsage, []string{"--max-txn-ops 0", "8..65536"}},
		{"doctor max-txn-ops huge", on("/bad/", "doctor", "--max-txn-ops", "100000000"), exitUsage, []string{"--max-txn-ops 100000000", "8..65536"}},
		{"doctor max-request-bytes negative", on("/bad/", "doctor", "--max-request-bytes", "-5"), exitUsage, []string{"--max-request-bytes -5", "65536..67108864"}},
		{"doctor max-request-bytes huge", on("/bad/", "doctor", "--max-request-bytes", "1000000000000"), exitUsage, []string{"--max-request-bytes", "65536..67108864"}},
		{"doctor unknown profile", on("/bad/", "doctor", "--profile", "fast"), exitUsage, []string{`--profile "fast"`, "production, etcd-defaults"}},
		{"dial-timeout zero", on("/bad/", "--dial-timeout", "0s", "owners"), exitUsage, []string{"--dial-timeout 0s is out of range", "10ms..10m0s"}},
		{"command-timeout 1ns", on("/bad/", "--command-timeout", "1ns", "owners"), exitUsage, []string{"--command-timeout 1ns is out of range", "10ms..24h0m0s"}},
		{"list limit negative", on("/bad/", "list", "--limit", "-3"), exitUsage, []string{"--limit -3 is out of range", "1..1000"}},
		{"list limit huge", on("/bad/", "list", "--limit", "5000"), exitUsage, []string{"--limit 5000", "1..1000"}},
		{"watch rev negative", on("/bad/", "watch", "--rev", "-1"), exitUsage, []string{"--rev -1 is out of range"}},
		{"watch count negative", on("/bad/", "watch", "--count", "-1"), exitUsage, []string{"--count -1 is out of range"}},
		{"lease-generation zero", on("/bad/", "remove-owner", "o", "--lease-generation", "0", "--yes"), exitUsage, []string{"--lease-generation 0 is out of range"}},
		{"capacity bad lifecycle", on(goldenNS, "capacity", "demo/node-a@x"), exitUsage, []string{"lifecycle after @"}},
		{"not a number", on("/bad/", "doctor", "--max-txn-ops", "many"), exitUsage, []string{"--max-txn-ops", "Usage: authorityctl doctor"}},

		// empty endpoints: refused before any dial (a refused port would exit 3)
		{"endpoints comma", []string{"--endpoints", ",", "owners"}, exitUsage, []string{`--endpoints ","`, "element 1 of 2 is empty"}},
		{"endpoints blank", []string{"--endpoints", " ", "owners"}, exitUsage, []string{"element 1 of 1 is empty"}},
		{"endpoints trailing comma", []string{"--endpoints", "127.0.0.1:1,", "owners"}, exitUsage, []string{"element 2 of 2 is empty"}},

		// namespaces and prefixes: known before any etcd call (127.0.0.1:1 refuses: a dial would exit 3)
		{"namespace rows segment", onRefused("/x/rows/", "owners"), exitUsage, []string{`path segment "rows"`}},
		{"namespace capacity segment", onRefused("/x/capacity/", "list"), exitUsage, []string{`path segment "capacity"`}},
		{"namespace owners segment", onRefused("/x/owners/", "get", "user_spot", "a"), exitUsage, []string{`path segment "owners"`}},
		{"namespace with NUL", onRefused("/x\x00y/", "owners"), exitUsage, []string{"must not contain NUL"}},
		{"namespace without slash", onRefused("/x", "owners"), exitUsage, []string{"must end in"}},
		{"list prefix with NUL", onRefused("/x/", "list", "user_spot/a\x00"), exitUsage, []string{"PREFIX", "must not contain NUL"}},

		// connection errors: what failed, for which endpoint, at once
		{"refused port", []string{"--endpoints", "127.0.0.1:1", "--dial-timeout", "30s", "owners"}, exitConnect,
			[]string{"endpoint 127.0.0.1:1", "connection refused"}},
		{"unknown host", []string{"--endpoints", "no-such-host.invalid:2379", "--dial-timeout", "30s", "owners"}, exitConnect,
			[]string{"endpoint no-such-host.invalid:2379", "no such host"}},
		{"silent endpoint blames dial-timeout", []string{"--endpoints", silent, "--dial-timeout", "300ms", "owners"}, exitConnect,
			[]string{"endpoint " + silent, "no etcd answer came within --dial-timeout 300ms"}},
		{"command-timeout ends the dial", []string{"--endpoints", silent, "--dial-timeout", "30s", "--command-timeout", "300ms", "owners"}, exitConnect,
			[]string{"--command-timeout 300ms ran out while connecting"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, errOut, code := cliBounded(t, context.Background(), 15*time.Second, c.args...)
			require.Equal(t, c.code, code, "stdout: %s\nstderr: %s", out, errOut)
			for _, s := range c.contains {
				require.Contains(t, errOut, s)
			}
			if strings.Contains(c.name, "NUL") {
				require.NotContains(t, errOut, "must end in", "the message names the NUL, not the slash")
			}
			require.NotContains(t, errOut, "Global Flags", "usage errors are short")
			require.LessOrEqual(t, strings.Count(errOut, "\n"), 4, "usage errors are short: %s", errOut)
		})
	}
}

// onRefused is on with an endpoint that refuses connections: a command
// that dials it exits 3, so an exit 2 shows the input was refused first.
func onRefused(ns string, args ...string) []string {
	return append([]string{"--endpoints", "127.0.0.1:1", "--namespace", ns}, args...)
}

// TestDeadEndpointInList: a dead endpoint next to a live one neither fails
// the command nor waits for its --dial-timeout, and is named on stderr.
func TestDeadEndpointInList(t *testing.T) {
	silent := silentEndpoint(t)
	for _, dead := range []string{"127.0.0.1:1", silent} {
		out, errOut, code := cliBounded(t, context.Background(), 15*time.Second,
			"--endpoints", dead+","+testEndpoint, "--dial-timeout", "60s", "--namespace", goldenNS, "get", "user_spot", "room-1")
		require.Equal(t, 0, code, errOut)
		require.Contains(t, out, "user_spot/room-1")
		if dead == "127.0.0.1:1" {
			require.Contains(t, errOut, "endpoint 127.0.0.1:1")
		}
	}
}

// TestCapacityAcceptsItsOwnNode: the NODE text capacity prints is accepted
// back.
func TestCapacityAcceptsItsOwnNode(t *testing.T) {
	out, errOut, code := cli(t, nil, on(goldenNS, "capacity", "-o", "json")...)
	require.Equal(t, 0, code, errOut)
	var all itemsView[capacityUsageView]
	require.NoError(t, json.Unmarshal([]byte(out), &all))
	require.NotEmpty(t, all.Items)
	for _, u := range all.Items {
		node := fmt.Sprintf("%s/%s@%d", u.MeshName, u.NodeRID, u.LifecycleGeneration)
		table, errOut, code := cli(t, nil, on(goldenNS, "capacity", node)...)
		require.Equal(t, 0, code, "capacity %s: %s", node, errOut)
		require.Contains(t, table, node)
	}
	_, errOut, code = cli(t, nil, on(goldenNS, "capacity", "demo/node-a@2")...)
	require.Equal(t, exitFailure, code)
	require.Contains(t, errOut, "holds no capacity")
}

// TestWatchStoppedByUser: a watch ended by the user (the signal context
// the process runs under) exits 130, as every command stopped so does, and
// says nothing on stderr.
func TestWatchStoppedByUser(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		time.Sleep(500 * time.Millisecond)
		cancel()
	}()
	out, errOut, code := cliBounded(t, ctx, 15*time.Second, on(goldenNS, "watch")...)
	require.Equal(t, exitInterrupted, code, "stdout: %s\nstderr: %s", out, errOut)
	require.Empty(t, errOut)
}

// TestSignalStopsDoctor: every command stops when the user stops it.
func TestSignalStopsDoctor(t *testing.T) {
	silent := silentEndpoint(t)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		time.Sleep(300 * time.Millisecond)
		cancel()
	}()
	_, errOut, code := cliBounded(t, ctx, 15*time.Second, "--endpoints", silent, "--dial-timeout", "60s", "doctor")
	require.Equal(t, exitInterrupted, code)
	require.Contains(t, errOut, "stopped")
}

// TestDoctorDefaultsAreProduction: doctor checks 1024 ops and 4 MiB by
// default; against a server at etcd's default limits it fails with
// sentences naming the server flags, and writes nothing.
func TestDoctorDefaultsAreProduction(t *testing.T) {
	ctx := context.Background()
	srv, err := embedded.Start(ctx, embedded.Config{Dir: t.TempDir()}) // etcd defaults: 128 ops, 1.5 MiB
	require.NoError(t, err)
	defer srv.Close()
	out, errOut, code := cliBounded(t, ctx, 60*time.Second, "--endpoints", srv.Endpoint(), "--namespace", "/doc/", "doctor", "-o", "json")
	require.Equal(t, exitFailure, code, errOut)
	var d doctorView
	require.NoError(t, json.Unmarshal([]byte(out), &d))
	detail := map[string]checkView{}
	for _, c := range d.Checks {
		detail[c.Check] = c
	}
	require.Equal(t, checkFail, detail["max txn ops"].Status)
	require.Contains(t, detail["max txn ops"].Detail, "refuses a Txn of 1024 operations: its --max-txn-ops is lower")
	require.Equal(t, checkFail, detail["max request bytes"].Status)
	require.Regexp(t, `the server refuses a request of 4\.0 MiB at its gRPC receive limit of 2\.0 MiB \(its --max-request-bytes \+ 512 KiB, so --max-request-bytes is about 1\.5 MiB\): raise the server's --max-request-bytes to at least 4194304`,
		detail["max request bytes"].Detail)
	require.NotContains(t, detail["max request bytes"].Detail, "received message larger than max")
	require.Contains(t, detail["lease checkpointing"].Detail, "--feature-gates=LeaseCheckpoint=true,LeaseCheckpointPersist=true")

	// the etcd-defaults profile passes on that server; a request just
	// above 1.5 MiB is refused by --max-request-bytes itself
	_, errOut, code = cliBounded(t, ctx, 60*time.Second, "--endpoints", srv.Endpoint(), "--namespace", "/doc/", "doctor", "--profile", "etcd-defaults")
	require.Equal(t, 0, code, errOut)
	out, _, code = cliBounded(t, ctx, 60*time.Second, "--endpoints", srv.Endpoint(), "--namespace", "/doc/", "doctor",
		"--profile", "etcd-defaults", "--max-request-bytes", "1700000")
	require.Equal(t, exitFailure, code)
	require.Contains(t, out, "its --max-request-bytes is below the provider's MaxRequestBytes 1700000")

	// the probes left no key and no revision behind
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	require.NoError(t, err)
	defer c.Close()
	before, err := c.Get(ctx, "/doc/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	_, _, _ = cliBounded(t, ctx, 60*time.Second, "--endpoints", srv.Endpoint(), "--namespace", "/doc/", "doctor")
	after, err := c.Get(ctx, "/doc/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	require.Zero(t, after.Count)
	require.Equal(t, before.Header.Revision, after.Header.Revision, "doctor wrote a revision")
}

// TestOutputFormats: every command's -o json is one JSON document (a
// listing is {"items": [...]}), and -o wide adds columns to table.
func TestOutputFormats(t *testing.T) {
	for _, args := range [][]string{{"list"}, {"owners"}, {"capacity"}, {"terminals"}, {"reservations"}, {"aggregates"}, {"blobs"}} {
		out, errOut, code := cli(t, nil, on(goldenNS, append(args, "-o", "json")...)...)
		require.Equal(t, 0, code, errOut)
		var v struct {
			Items []json.RawMessage `json:"items"`
		}
		require.NoError(t, json.Unmarshal([]byte(out), &v), "%s -o json", args[0])
		require.NotNil(t, v.Items, "%s -o json has items", args[0])
	}
	for _, args := range [][]string{{"reservations"}, {"doctor", "--no-probe"}} {
		table, _, code := cli(t, nil, on(goldenNS, append(args, "-o", "table")...)...)
		require.Equal(t, 0, code)
		wide, _, code := cli(t, nil, on(goldenNS, append(args, "-o", "wide")...)...)
		require.Equal(t, 0, code)
		require.Greater(t, len(strings.Fields(strings.SplitN(wide, "\n", 2)[0])), len(strings.Fields(strings.SplitN(table, "\n", 2)[0])),
			"%s -o wide adds columns:\n%s", args[0], wide)
	}
	out, _, code := cli(t, nil, "--version")
	require.Equal(t, 0, code)
	require.Regexp(t, `^authorityctl \S+.* \(go1\.\d+.*etcd client .*etcd server >= 3\.4\.0\)\n$`, out)
}
