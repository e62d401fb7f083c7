package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/embedded"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// cli runs authorityctl in-process with env as its environment.
func cli(t *testing.T, env map[string]string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(context.Background(), args, &out, &errOut, func(k string) string { return env[k] })
	return out.String(), errOut.String(), code
}

// on prefixes args with the connection flags of the shared server.
func on(ns string, args ...string) []string {
	return append([]string{"--endpoints", testEndpoint, "--namespace", ns}, args...)
}

// scrubbers replace what differs between runs: random IDs, clocks, lease IDs.
var scrubbers = []struct {
	re   *regexp.Regexp
	with string
}{
	{regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`), "<uuid>"},
	{regexp.MustCompile(`[0-9a-f]{64}`), "<sha256>"},
	{regexp.MustCompile(`127\.0\.0\.1:\d+`), "<endpoint>"},
	{regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z`), "<time>"},
	{regexp.MustCompile(`"(ttlSeconds|leaseId)": ("?)[0-9a-f]+("?)`), `"$1": "<lease>"`},
	{regexp.MustCompile(`(leaseId: )"?[0-9a-f]+"?`), `$1<lease>`},
	{regexp.MustCompile(`(ttlSeconds: )\d+`), `$1<lease>`},
	{regexp.MustCompile(`\b(\d+d\d+h|\d+h\d+m|\d+m\d+s|\d+s)$`), "<age>"},
	{regexp.MustCompile(`\b(\d+d\d+h|\d+h\d+m|\d+m\d+s|\d+s)(\s{3,})`), "<age>   "}, // the column width follows the age
}

func scrub(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		for _, sc := range scrubbers {
			l = sc.re.ReplaceAllString(l, sc.with)
		}
		lines[i] = l
	}
	return strings.Join(lines, "\n")
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	got = scrub(got)
	if *update {
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
		return
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "missing golden file; run go test -run %s -update", t.Name())
	require.Equal(t, string(want), got, "output differs from %s (go test -update rewrites it)", path)
}

func TestGolden(t *testing.T) {
	cases := []struct {
		name string
		args []string
	}{
		{"list", []string{"list"}},
		{"list_wide", []string{"list", "-o", "wide"}},
		{"list_json", []string{"list", "-o", "json"}},
		{"list_yaml", []string{"list", "-o", "yaml"}},
		{"list_prefix", []string{"list", "user_spot/"}},
		{"get_user_spot", []string{"get", "user_spot", "room-1"}},
		{"get_user_spot", []string{"get", "user_spot/room-1"}}, // the key as list prints it
		{"get_user_spot", []string{"get", "user-spot/room-1"}},
		{"get_instance_json", []string{"get", "instance-spot", "inventory-2", "-o", "json"}},
		{"get_actor_yaml", []string{"get", "actor", "greeter-1", "-o", "yaml"}},
		{"owners", []string{"owners"}},
		{"owners_json", []string{"owners", "-o", "json"}},
		{"capacity", []string{"capacity"}},
		{"capacity_wide", []string{"capacity", "-o", "wide"}},
		{"capacity_node_b", []string{"capacity", "demo/node-b"}},
		{"capacity_json", []string{"capacity", "-o", "json"}},
		{"terminals", []string{"terminals"}},
		{"terminals_json", []string{"terminals", "-o", "json"}},
		{"reservations", []string{"reservations"}},
		{"reservations_yaml", []string{"reservations", "-o", "yaml"}},
		{"reservations_wide", []string{"reservations", "-o", "wide"}},
		{"blobs", []string{"blobs"}},
		{"blobs_json", []string{"blobs", "-o", "json"}},
		{"aggregates", []string{"aggregates"}},
		{"aggregates_wide", []string{"aggregates", "-o", "wide"}},
		{"aggregates_json", []string{"aggregates", "-o", "json"}},
		{"watch", []string{"watch", "--rev", "1", "--count", "8"}},
		{"watch_json", []string{"watch", "user_spot/room-1", "--rev", "1", "--count", "3", "-o", "json"}},
		{"watch_yaml", []string{"watch", "actor/", "--rev", "1", "--count", "2", "-o", "yaml"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, errOut, code := cli(t, nil, on(goldenNS, c.args...)...)
			require.Equal(t, 0, code, "stderr: %s", errOut)
			golden(t, c.name, out)
		})
	}
}

func TestListPaging(t *testing.T) {
	full, _, code := cli(t, nil, on(goldenNS, "list", "-o", "json")...)
	require.Equal(t, 0, code)
	var all listView
	require.NoError(t, json.Unmarshal([]byte(full), &all))
	require.Len(t, all.Items, 7)
	require.False(t, all.More)

	paged, _, code := cli(t, nil, on(goldenNS, "list", "-o", "json", "--limit", "2", "--all")...)
	require.Equal(t, 0, code)
	require.Equal(t, full, paged, "--all over pages of 2 must list the same rows")

	first, errOut, code := cli(t, nil, on(goldenNS, "list", "-o", "json", "--limit", "2")...)
	require.Equal(t, 0, code)
	var page listView
	require.NoError(t, json.Unmarshal([]byte(first), &page))
	require.Len(t, page.Items, 2)
	require.True(t, page.More)
	require.Equal(t, all.Items[:2], page.Items)
	require.Contains(t, errOut, "--all")

	_, errOut, code = cli(t, nil, on(goldenNS, "list", "--limit", "0")...)
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "--limit")
}

func TestErrors(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.pem")
	require.NoError(t, os.WriteFile(garbage, []byte("not a certificate"), 0o600))
	cases := []struct {
		name     string
		env      map[string]string
		args     []string
		code     int
		contains []string
	}{
		{"unreachable endpoint", nil, []string{"--endpoints", "127.0.0.1:1", "--dial-timeout", "200ms", "list"},
			exitConnect, []string{"endpoint 127.0.0.1:1", "connection refused"}},
		{"unreachable from env", map[string]string{"AUTHORITYCTL_ENDPOINTS": "127.0.0.1:1", "AUTHORITYCTL_DIAL_TIMEOUT": "200ms"},
			[]string{"owners"}, exitConnect, []string{"127.0.0.1:1"}},
		{"missing CA file", nil, []string{"--cacert", filepath.Join(dir, "nope.pem"), "list"},
			exitConnect, []string{"--cacert", "nope.pem"}},
		{"CA file without certificate", nil, []string{"--cacert", garbage, "doctor"},
			exitConnect, []string{"--cacert", "garbage.pem", "no PEM certificate"}},
		{"missing cert file", nil, []string{"--cert", filepath.Join(dir, "client.pem"), "--key", garbage, "list"},
			exitConnect, []string{"--cert", "client.pem"}},
		{"bad key pair", nil, []string{"--cert", garbage, "--key", garbage, "list"},
			exitConnect, []string{"--cert", "--key", "garbage.pem"}},
		{"cert without key", nil, []string{"--cert", garbage, "list"}, exitUsage, []string{"--cert and --key", "Usage:"}},
		{"unknown kind", nil, on(goldenNS, "get", "widget", "x"), exitUsage,
			[]string{`unknown kind "widget"`, "actor, user_spot, instance_spot"}},
		{"bad flag", nil, []string{"list", "--bogus"}, exitUsage, []string{"unknown flag: --bogus", "Usage:", "authorityctl list"}},
		{"bad global flag value", nil, []string{"--dial-timeout", "soon", "list"}, exitUsage, []string{"dial-timeout", "Usage:"}},
		{"bad env value", map[string]string{"AUTHORITYCTL_DIAL_TIMEOUT": "soon"}, []string{"list"}, exitUsage,
			[]string{"AUTHORITYCTL_DIAL_TIMEOUT"}},
		{"wrong arg count", nil, []string{"get", "actor"}, exitUsage, []string{"KIND ID or KIND/ID", "Usage:"}},
		{"too many args", nil, []string{"get", "actor", "a", "b"}, exitUsage, []string{"accepts between 1 and 2 arg(s)", "Usage:"}},
		{"unknown command", nil, []string{"frobnicate"}, exitUsage, []string{"unknown command", "Usage:"}},
		{"unknown command with a suggestion", nil, []string{"prune"}, exitUsage, []string{`unknown command "prune"`, "did you mean prune-epochs?"}},
		{"no command", nil, nil, exitUsage, []string{"a command is required"}},
		{"demo --listen not an address", nil, []string{"demo", "--listen", "notanaddr"}, exitUsage, []string{`--listen "notanaddr" is not host:port`, "Usage:"}},
		{"demo --metrics-addr not an address", nil, []string{"demo", "--metrics-addr", "host:port"}, exitUsage, []string{"--metrics-addr"}},
		{"bad output", nil, []string{"-o", "xml", "list"}, exitUsage, []string{"xml", "table, wide, json, yaml"}},
		{"bad namespace", nil, []string{"--namespace", "/x", "list"}, exitUsage, []string{"must end in"}},
		{"missing row", nil, on(goldenNS, "get", "user_spot", "nope"), exitFailure, []string{"not found"}},
		{"capacity of unknown node", nil, on(goldenNS, "capacity", "node-z"), exitFailure, []string{"node-z", "not found"}},
		{"remove-owner needs --yes", nil, on(goldenNS, "remove-owner", "owner-a", "--lease-generation", "1"),
			exitUsage, []string{"--yes", "--dry-run"}},
		{"remove-owner needs generation", nil, on(goldenNS, "remove-owner", "owner-a", "--yes"),
			exitUsage, []string{"--lease-generation"}},
		{"prune-epochs needs --yes", nil, on(goldenNS, "prune-epochs"), exitUsage, []string{"--yes", "--dry-run"}},
		{"remove-owner refuses a live owner", nil, on(goldenNS, "remove-owner", "owner-a", "--lease-generation", "1", "--yes"),
			exitFailure, []string{"still live", "--force"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, errOut, code := cli(t, c.env, c.args...)
			require.Equal(t, c.code, code, "stdout: %s\nstderr: %s", out, errOut)
			for _, s := range c.contains {
				require.Contains(t, errOut, s)
			}
		})
	}
}

func TestEnvironment(t *testing.T) {
	env := map[string]string{"AUTHORITYCTL_ENDPOINTS": testEndpoint, "AUTHORITYCTL_NAMESPACE": goldenNS, "AUTHORITYCTL_OUTPUT": "json"}
	out, errOut, code := cli(t, env, "get", "user_spot", "room-3")
	require.Equal(t, 0, code, errOut)
	var v rowView
	require.NoError(t, json.Unmarshal([]byte(out), &v))
	require.Equal(t, "owner-a", v.OwnerID)

	// a flag wins over its variable
	env["AUTHORITYCTL_ENDPOINTS"] = "127.0.0.1:1"
	out, errOut, code = cli(t, env, "--endpoints", testEndpoint, "-o", "table", "get", "user_spot", "room-3")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "user_spot/room-3")

	// another namespace holds nothing
	_, _, code = cli(t, env, "--endpoints", testEndpoint, "--namespace", "/empty/", "get", "user_spot", "room-3")
	require.Equal(t, exitFailure, code)
}

func TestCredentials(t *testing.T) {
	g := &globals{user: "root:secret"}
	u, p := g.credentials()
	require.Equal(t, "root", u)
	require.Equal(t, "secret", p)
	g = &globals{user: "root", password: "pw"}
	u, p = g.credentials()
	require.Equal(t, "root", u)
	require.Equal(t, "pw", p)
	// the password comes from the environment too
	env := map[string]string{"AUTHORITYCTL_PASSWORD": "from-env"}
	root := newRootCommand(&bytes.Buffer{}, &bytes.Buffer{}, func(k string) string { return env[k] })
	root.SetArgs([]string{"--user", "root", "--endpoints", "127.0.0.1:1", "--dial-timeout", "100ms", "owners"})
	require.Error(t, root.Execute())
	pw, err := root.PersistentFlags().GetString("password")
	require.NoError(t, err)
	require.Equal(t, "from-env", pw)
}

func TestDoctor(t *testing.T) {
	ns := "/doctor/"
	out, errOut, code := cli(t, nil, on(ns, "doctor", "-o", "json")...)
	require.Equal(t, 0, code, "stdout: %s\nstderr: %s", out, errOut)
	var d doctorView
	require.NoError(t, json.Unmarshal([]byte(out), &d))
	require.Len(t, d.Endpoints, 1)
	require.True(t, d.Endpoints[0].Reachable)
	require.Equal(t, "3.7.3", d.Endpoints[0].Version)
	require.Positive(t, d.Endpoints[0].DBSizeQuota)
	status := map[string]string{}
	for _, c := range d.Checks {
		status[c.Check] = c.Status
	}
	require.Equal(t, checkOK, status["endpoint "+testEndpoint])
	require.Equal(t, checkOK, status["leader"])
	require.Equal(t, checkOK, status["alarms"])
	require.Equal(t, checkOK, status["max txn ops"])
	require.Equal(t, checkOK, status["max request bytes"])
	require.Contains(t, []string{checkOK, checkInfo}, status["compaction"])
	require.Equal(t, checkOK, status["capacity epochs"])
	requireNoKeys(t, ns)

	// a provider configured beyond the server's limits fails the doctor
	out, _, code = cli(t, nil, on(ns, "doctor", "--max-txn-ops", "2000", "--max-request-bytes", "8388608")...)
	require.Equal(t, exitFailure, code)
	require.Regexp(t, `max txn ops\s+fail`, out)
	require.Regexp(t, `max request bytes\s+fail`, out)
	requireNoKeys(t, ns)

	out, _, code = cli(t, nil, on(ns, "doctor", "--no-probe")...)
	require.Equal(t, 0, code)
	require.Contains(t, out, "probes skipped")
}

// TestDoctorCapacityEpochs: the doctor accepts capacity entries the store
// wrote (each moved its node's epoch) and warns about one written without
// its epoch, as a build without epochs would.
func TestDoctorCapacityEpochs(t *testing.T) {
	ns := "/doctor-epochs/"
	ctx := context.Background()
	s, err := etcdstore.New(ctx, etcdstore.Config{Client: testClient, Namespace: ns})
	require.NoError(t, err)
	defer s.Close()
	fx := conformance.NewFixture(t, &conformance.Harness{Store: s, SetLive: func(t testing.TB, node authority.NodeDescriptor, lifecycle int64, owner authority.OwnerToken, live bool) {
		require.NoError(t, s.MarkLive(ctx, node, lifecycle, owner, time.Minute))
	}, Now: time.Now})
	fx.Active(authority.ObjectUserSpot, "a", conformance.TargetA)
	fx.Reserve(authority.ObjectActor, "b", conformance.TargetB)
	out, _, code := cli(t, nil, on(ns, "doctor", "--no-probe")...)
	require.Equal(t, 0, code, out)
	require.Regexp(t, `capacity epochs\s+ok\s+2 node lifecycle\(s\) with capacity entries, each epoch current`, out)

	// an entry written by hand, without its node's epoch
	_, err = testClient.Put(ctx, ns+"capacity/mesh-1/node-a/1/row/user_spot/by-hand", `{"st":"active","a":1}`)
	require.NoError(t, err)
	out, _, code = cli(t, nil, on(ns, "doctor", "--no-probe")...)
	require.Equal(t, 0, code, out)
	require.Regexp(t, `capacity epochs\s+warn\s+1 of 2 node lifecycle\(s\) have capacity entries newer than their epoch \(mesh-1/node-a/1\)`, out)
	_, err = testClient.Delete(ctx, ns, clientv3.WithPrefix())
	require.NoError(t, err)
}

func TestDoctorSeesCompaction(t *testing.T) {
	// its own server: compaction would break the shared server's watch --rev 1
	ctx := context.Background()
	srv, err := embedded.Start(ctx, embedded.Config{Dir: t.TempDir()})
	require.NoError(t, err)
	defer srv.Close()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	require.NoError(t, err)
	defer c.Close()
	var rev int64
	for i := 0; i < 5; i++ {
		resp, err := c.Put(ctx, "/compaction/k", "v")
		require.NoError(t, err)
		rev = resp.Header.Revision
	}
	_, err = c.Compact(ctx, rev-1, clientv3.WithCompactPhysical())
	require.NoError(t, err)
	out, _, code := cli(t, nil, "--endpoints", srv.Endpoint(), "--namespace", "/compaction/", "doctor", "--no-probe")
	require.Equal(t, 0, code)
	require.Regexp(t, fmt.Sprintf(`compaction\s+ok\s+compacted up to revision %d of %d`, rev-1, rev), out)
}

func requireNoKeys(t *testing.T, prefix string) {
	t.Helper()
	resp, err := testClient.Get(context.Background(), prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	require.Zero(t, resp.Count, "keys left under %s", prefix)
}

func TestRemoveOwner(t *testing.T) {
	ctx := context.Background()
	ns := fmt.Sprintf("/remove-%d/", time.Now().UnixNano())
	store, err := etcdstore.New(ctx, etcdstore.Config{Client: testClient, Namespace: ns})
	require.NoError(t, err)
	defer store.Close()
	leases, _, err := populateDemo(ctx, store, func(string, ...any) {})
	require.NoError(t, err)
	defer func() {
		for _, l := range leases {
			_ = l.Close(ctx)
		}
	}()

	out, errOut, code := cli(t, nil, on(ns, "remove-owner", "owner-a", "--lease-generation", "1", "--dry-run", "-o", "json")...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, errOut, "is live")
	var dry removalView
	require.NoError(t, json.Unmarshal([]byte(out), &dry))
	require.True(t, dry.DryRun)
	keys := []string{}
	for _, r := range *dry.Rows {
		keys = append(keys, r.Key)
	}
	require.Equal(t, []string{"actor/greeter-1", "user_spot/room-3"}, keys)
	// the dry run wrote nothing
	_, _, code = cli(t, nil, on(ns, "get", "actor", "greeter-1")...)
	require.Equal(t, 0, code)

	// the owner's lease ends: its rows can be removed
	require.NoError(t, leases[0].Close(ctx))
	out, errOut, code = cli(t, nil, on(ns, "remove-owner", "owner-a", "--lease-generation", "1", "--yes")...)
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `owner-a\s+1\s+2`, out)
	for _, id := range []string{"greeter-1"} {
		_, _, code = cli(t, nil, on(ns, "get", "actor", id)...)
		require.Equal(t, exitFailure, code)
	}
	_, _, code = cli(t, nil, on(ns, "capacity", "node-a")...)
	require.Equal(t, exitFailure, code, "node-a's capacity must be released")
	out, _, code = cli(t, nil, on(ns, "list", "-o", "json")...)
	require.Equal(t, 0, code)
	var rest listView
	require.NoError(t, json.Unmarshal([]byte(out), &rest))
	require.Len(t, rest.Items, 5)
	u, err := store.CapacityUsage(ctx, demoNodeA, 1, authority.ObjectActor, "")
	require.NoError(t, err)
	require.Zero(t, u.Active)

	// again: nothing left to remove
	out, _, code = cli(t, nil, on(ns, "remove-owner", "owner-a", "--lease-generation", "1", "--yes", "-o", "json")...)
	require.Equal(t, 0, code)
	require.Contains(t, out, `"removed": 0`)
}

// prune-epochs lists, then deletes, the epoch of a node lifecycle whose
// capacity was all released; nodes that still hold capacity keep theirs.
func TestPruneEpochs(t *testing.T) {
	ctx := context.Background()
	ns := fmt.Sprintf("/prune-%d/", time.Now().UnixNano())
	store, err := etcdstore.New(ctx, etcdstore.Config{Client: testClient, Namespace: ns})
	require.NoError(t, err)
	defer store.Close()
	defer func() { _, _ = testClient.Delete(ctx, ns, clientv3.WithPrefix()) }()
	leases, _, err := populateDemo(ctx, store, func(string, ...any) {})
	require.NoError(t, err)
	defer func() {
		for _, l := range leases {
			_ = l.Close(ctx)
		}
	}()
	dryRun := func() pruneView {
		t.Helper()
		out, errOut, code := cli(t, nil, on(ns, "prune-epochs", "--dry-run", "-o", "json")...)
		require.Equal(t, 0, code, errOut)
		var v pruneView
		require.NoError(t, json.Unmarshal([]byte(out), &v))
		require.True(t, v.DryRun)
		return v
	}
	require.Empty(t, dryRun().Epochs, "every node of the demo holds capacity")

	require.NoError(t, leases[0].Close(ctx))
	_, errOut, code := cli(t, nil, on(ns, "remove-owner", "owner-a", "--lease-generation", "1", "--yes")...)
	require.Equal(t, 0, code, errOut)
	require.Equal(t, []epochView{{Mesh: demoNodeA.MeshName, Node: demoNodeA.RID, Lifecycle: 1}}, dryRun().Epochs)
	out, errOut, code := cli(t, nil, on(ns, "prune-epochs", "--dry-run")...)
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `would prune 1 capacity epochs:\n`, out)
	require.Regexp(t, demoNodeA.RID+`\s+1\n`, out)

	out, errOut, code = cli(t, nil, on(ns, "prune-epochs", "--yes")...)
	require.Equal(t, 0, code, errOut)
	require.Regexp(t, `pruned 1 keys \(capacity epochs and empty owner directories\); the epochs:\nMESH\s+NODE\s+LIFECYCLE\s*\ndemo\s+node-a\s+1\s*\n`, out)
	require.Empty(t, dryRun().Epochs)
	epochs, err := testClient.Get(ctx, schema.Prefix(ns, schema.EntryCapacityEpoch), clientv3.WithPrefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	require.Positive(t, epochs.Count, "the other nodes keep their epochs")
	out, _, code = cli(t, nil, on(ns, "prune-epochs", "--yes", "-o", "json")...)
	require.Equal(t, 0, code)
	require.Contains(t, out, `"pruned": 0`)
}

func TestDemo(t *testing.T) {
	out, errOut, code := cli(t, nil, "demo", "--data-dir", t.TempDir())
	require.Equal(t, 0, code, errOut)
	require.Contains(t, errOut, "relocating room-1 and room-2")
	golden(t, "demo", out)
}

// lineWriter collects output and signals each complete line.
type lineWriter struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	lines chan string
	part  string
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	w.part += string(p)
	for {
		i := strings.IndexByte(w.part, '\n')
		if i < 0 {
			return len(p), nil
		}
		select {
		case w.lines <- w.part[:i]:
		default:
		}
		w.part = w.part[i+1:]
	}
}

func TestDemoServe(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stdout := &lineWriter{lines: make(chan string, 1024)}
	var stderr bytes.Buffer
	done := make(chan int)
	go func() {
		done <- run(ctx, []string{"demo", "--serve", "--namespace", "/served/"}, stdout, &stderr, func(string) string { return "" })
	}()
	var endpoint string
	for endpoint == "" {
		select {
		case l := <-stdout.lines:
			if e, ok := strings.CutPrefix(l, "endpoint: "); ok {
				endpoint = e
			}
		case code := <-done:
			t.Fatalf("demo --serve exited %d: %s", code, stderr.String())
		}
	}
	out, errOut, code := cli(t, nil, "--endpoints", endpoint, "--namespace", "/served/", "list", "-o", "json")
	require.Equal(t, 0, code, errOut)
	var l listView
	require.NoError(t, json.Unmarshal([]byte(out), &l))
	require.Len(t, l.Items, 7)
	out, _, code = cli(t, nil, "--endpoints", endpoint, "--namespace", "/served/", "owners", "-o", "json")
	require.Equal(t, 0, code)
	var owners itemsView[ownerView]
	require.NoError(t, json.Unmarshal([]byte(out), &owners))
	require.Len(t, owners.Items, 2, "the owner leases stay live while serving")
	out, errOut, code = cli(t, nil, "--endpoints", endpoint, "--namespace", "/served/", "doctor")
	require.Equal(t, exitOK, code, "doctor passes against the demo's server (production limits):\n%s%s", out, errOut)
	cancel()
	require.Equal(t, exitInterrupted, <-done)
}

func TestAge(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0: "0s", 42 * time.Second: "42s", 192 * time.Second: "3m12s", 5*time.Hour + 3*time.Minute: "5h3m",
		52 * time.Hour: "2d4h", -3 * time.Second: "3s", 1499 * time.Millisecond: "1s",
	} {
		require.Equal(t, want, age(d), d.String())
	}
	now := time.Now()
	require.Equal(t, "1m0s", until(now.Add(time.Minute), now))
	require.Equal(t, "expired 5s ago", until(now.Add(-5*time.Second), now))
}

func TestPayloadView(t *testing.T) {
	require.Equal(t, `"hello"`, viewPayload([]byte("hello")).String())
	require.Equal(t, "(empty)", viewPayload(nil).String())
	bin := viewPayload([]byte{0, 1, 2, 0xff})
	require.Equal(t, "raw", bin.Codec)
	require.Equal(t, "hex:000102ff", bin.String())
	require.Empty(t, bin.Text)
	require.Equal(t, "AAEC/w==", bin.Base64)
}

func TestParseKind(t *testing.T) {
	for in, want := range map[string]authority.ObjectKind{
		"actor": authority.ObjectActor, "user_spot": authority.ObjectUserSpot, "user-spot": authority.ObjectUserSpot,
		"userspot": authority.ObjectUserSpot, "INSTANCE_SPOT": authority.ObjectInstanceSpot,
	} {
		got, err := parseKind(in)
		require.NoError(t, err)
		require.Equal(t, want, got)
	}
	_, err := parseKind("spot")
	require.Equal(t, exitUsage, exitCode(err))
}

// TestWatchLive watches from the next revision: a value that is no row is
// named (detail -) and its removal printed, with the typed feed's kinds.
func TestWatchLive(t *testing.T) {
	ctx := context.Background()
	ns := fmt.Sprintf("/watch-%d/", time.Now().UnixNano())
	resp, err := testClient.Get(ctx, "x")
	require.NoError(t, err)
	from := resp.Header.Revision + 1 // the next write: no race with the watch starting
	done := make(chan string)
	go func() {
		out, _, _ := cli(t, nil, on(ns, "watch", "--rev", fmt.Sprint(from), "--count", "2")...)
		done <- out
	}()
	// the watch's store announces itself, so the row's writes need not be
	// the next revisions: each is matched at its own
	put, err := testClient.Put(ctx, ns+"rows/actor/raw", "not a row")
	require.NoError(t, err)
	del, err := testClient.Delete(ctx, ns+"rows/actor/raw")
	require.NoError(t, err)
	out := <-done
	require.Regexp(t, fmt.Sprintf(`%d\s+CREATED\s+actor/raw\s+-`, put.Header.Revision), out)
	require.Regexp(t, fmt.Sprintf(`%d\s+REMOVED\s+actor/raw`, del.Header.Revision), out)
	_, _ = testClient.Delete(ctx, ns, clientv3.WithPrefix())
}

// TestDemoBadDataDir: a data directory etcd cannot create is one error line
// naming it, not the embedded server's JSON log.
func TestDemoBadDataDir(t *testing.T) {
	file := filepath.Join(t.TempDir(), "a-file")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	_, errOut, code := cli(t, nil, "demo", "--data-dir", filepath.Join(file, "etcd"))
	require.Equal(t, exitFailure, code, errOut)
	require.Contains(t, errOut, "a-file/etcd")
	require.NotContains(t, errOut, `{"level"`)
}

func TestDemoReusedDataDir(t *testing.T) {
	dir := t.TempDir()
	first, errOut, code := cli(t, nil, "demo", "--data-dir", dir, "-o", "json")
	require.Equal(t, 0, code, errOut)
	second, errOut, code := cli(t, nil, "demo", "--data-dir", dir, "-o", "json")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, errOut, "already holds rows")
	// the rows survived the restart; the owner leases did not
	var one, two demoView
	require.NoError(t, json.Unmarshal([]byte(first), &one), "demo -o json is one JSON document")
	require.NoError(t, json.Unmarshal([]byte(second), &two))
	require.JSONEq(t, string(one.Rows), string(two.Rows))
	require.Len(t, one.Moved, 2)
	require.Equal(t, "owner-a/1", one.Moved[0].Before.Owner)
	require.Equal(t, "owner-b/1", one.Moved[0].After.Owner)
	require.Equal(t, "demo/node-b@1", one.Moved[0].After.Node)
	require.Contains(t, one.History, "watch --rev 1")
	require.JSONEq(t, `{"items":[]}`, string(two.Owners))
}

func TestHelpDocumentsExitCodes(t *testing.T) {
	out, _, code := cli(t, nil, "--help")
	require.Equal(t, 0, code)
	for _, s := range []string{"Exit codes:", "2  usage error", "3  cannot connect", "AUTHORITYCTL_PASSWORD"} {
		require.Contains(t, out, s)
	}
}

func TestVersionOutput(t *testing.T) {
	out, _, code := cli(t, nil, "--version", "-o", "json")
	require.Equal(t, exitOK, code)
	var v versionView
	require.NoError(t, json.Unmarshal([]byte(out), &v), out)
	require.Equal(t, runtime.Version(), v.Go)
	out, _, code = cli(t, nil, "--version")
	require.Equal(t, exitOK, code)
	require.True(t, strings.HasPrefix(out, "authorityctl "), out)
}
