package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/sharded"
)

// shardedFixture is a sharded store of two shards, the shared server and
// one of its own, with rows in both, and a --shards file naming them.
func shardedFixture(t *testing.T) (*sharded.Store, []authority.Key, string, []etcdstore.Config) {
	t.Helper()
	second := etcdtest.Start(t)
	c2 := second.Client(t)
	cfgs := []etcdstore.Config{
		{Client: testClient, Namespace: etcdtest.Namespace()},
		{Client: c2, Namespace: etcdtest.Namespace()},
	}
	for _, c := range cfgs {
		t.Cleanup(func() { _, _ = c.Client.Delete(context.Background(), c.Namespace, clientv3.WithPrefix()) })
	}
	s, err := sharded.New(context.Background(), sharded.Config{Shards: cfgs})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	fx := conformance.NewFixture(t, &conformance.Harness{
		Store: s, Now: time.Now,
		SetLive: func(t testing.TB, node authority.NodeDescriptor, gen int64, owner authority.OwnerToken, live bool) {
			if live {
				require.NoError(t, s.MarkLive(context.Background(), node, gen, owner, time.Minute))
			}
		},
	})
	var keys []authority.Key
	for i := range 10 {
		id := fmt.Sprintf("sharded-%02d", i)
		fx.Active(authority.ObjectActor, id, conformance.TargetA)
		keys = append(keys, fx.Key(authority.ObjectActor, id))
	}
	for i := range 2 {
		found := false
		for _, k := range keys {
			found = found || s.ShardOf(k) == i
		}
		require.True(t, found, "no row in shard %d", i)
	}
	return s, keys, writeShards(t, cfgs, []string{testEndpoint, second.Endpoint()}), cfgs
}

// writeShards writes a --shards file of the shards in order.
func writeShards(t *testing.T, cfgs []etcdstore.Config, endpoints []string) string {
	t.Helper()
	set := shardSet{}
	for i, c := range cfgs {
		set.Shards = append(set.Shards, shardEntry{Endpoints: []string{endpoints[i]}, Namespace: c.Namespace})
	}
	raw, err := json.Marshal(set)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "shards.json")
	require.NoError(t, os.WriteFile(path, raw, 0o600))
	return path
}

// TestShardsListGetAndDoctor: with --shards, list merges every shard's rows
// in key order, get finds a row in its shard, and doctor checks each shard
// and the map.
func TestShardsListGetAndDoctor(t *testing.T) {
	s, keys, file, _ := shardedFixture(t)
	out, errOut, code := cli(t, nil, "--shards", file, "list", "actor/", "--all", "--limit", "3", "-o", "json")
	require.Equal(t, 0, code, errOut)
	var listed listView
	require.NoError(t, json.Unmarshal([]byte(out), &listed))
	require.Len(t, listed.Items, len(keys))
	for i, it := range listed.Items {
		require.Equal(t, string(keys[i]), it.Key)
	}
	last := keys[len(keys)-1]
	out, errOut, code = cli(t, nil, "--shards", file, "get", string(last), "-o", "json")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, string(last))
	_, _, code = cli(t, nil, "--shards", file, "get", "actor", "missing")
	require.Equal(t, 1, code)

	out, errOut, code = cli(t, nil, "--shards", file, "doctor", "--no-probe", "-o", "json")
	var d doctorView
	require.NoError(t, json.Unmarshal([]byte(out), &d), errOut)
	names := map[string]checkView{}
	for _, ch := range d.Checks {
		names[ch.Check] = ch
	}
	require.Equal(t, checkOK, names["shard map"].Status, "%+v", names["shard map"])
	require.Contains(t, names["shard map"].Detail, "2 shards")
	prefixed := map[string]bool{}
	failed := false
	for _, ch := range d.Checks {
		if before, _, ok := strings.Cut(ch.Check, ": "); ok && strings.HasPrefix(before, "shard ") {
			prefixed[before] = true
		}
		failed = failed || ch.Status == checkFail
	}
	require.Equal(t, map[string]bool{"shard 0": true, "shard 1": true}, prefixed)
	require.Equal(t, failed, code == 1, "exit code %d", code)
	require.Equal(t, 2, s.Shards())
}

// TestShardsMapMismatch: a --shards file naming the shards in another order
// fails list (exit 1, naming the mismatch) and doctor's map check, and
// writes nothing; a set of shards without a stored map is refused, its
// namespaces left empty.
func TestShardsMapMismatch(t *testing.T) {
	_, _, _, cfgs := shardedFixture(t)
	eps := make([]string, len(cfgs))
	for i, c := range cfgs {
		eps[i] = c.Client.Endpoints()[0]
	}
	swapped := writeShards(t, []etcdstore.Config{cfgs[1], cfgs[0]}, []string{eps[1], eps[0]})
	_, errOut, code := cli(t, nil, "--shards", swapped, "list")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "shard map mismatch")
	out, _, code := cli(t, nil, "--shards", swapped, "doctor", "--no-probe", "-o", "json")
	require.Equal(t, 1, code)
	require.Contains(t, out, `"check": "shard map"`)
	require.Contains(t, out, "shard map mismatch")

	fresh := []etcdstore.Config{{Client: cfgs[0].Client, Namespace: etcdtest.Namespace()}, {Client: cfgs[1].Client, Namespace: etcdtest.Namespace()}}
	path := writeShards(t, fresh, eps)
	_, errOut, code = cli(t, nil, "--shards", path, "list")
	require.Equal(t, 1, code, errOut)
	require.Contains(t, errOut, "no shard map stored")
	for _, c := range fresh {
		resp, err := c.Client.Get(context.Background(), c.Namespace, clientv3.WithPrefix(), clientv3.WithCountOnly())
		require.NoError(t, err)
		require.Zero(t, resp.Count, "a read-only command wrote to %s", c.Namespace)
	}
}

// TestShardsFlagIsChecked: --shards on a command that does not take it, and
// a file that is not a shard list, are usage errors (exit 2) before
// anything connects.
func TestShardsFlagIsChecked(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.json")
	require.NoError(t, os.WriteFile(good, []byte(`{"shards":[{"endpoints":["127.0.0.1:1"]}]}`), 0o600))
	_, errOut, code := cli(t, nil, "--shards", good, "owners")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "owners does not take --shards")
	for name, content := range map[string]string{
		"unknown field": `{"shards":[{"endpoints":["a:1"],"extra":1}]}`,
		"no shards":     `{"shards":[]}`,
		"no endpoints":  `{"shards":[{"namespace":"/a/"}]}`,
		"bad namespace": `{"shards":[{"endpoints":["a:1"],"namespace":"/a/rows/"}]}`,
		"cert alone":    `{"shards":[{"endpoints":["a:1"],"cert":"c.pem"}]}`,
		"unset env":     `{"shards":[{"endpoints":["a:1"],"user":"u","passwordEnv":"NOT_SET_ANYWHERE"}]}`,
		"not json":      `shards: []`,
	} {
		path := filepath.Join(dir, strings.ReplaceAll(name, " ", "-")+".json")
		require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
		_, errOut, code := cli(t, nil, "--shards", path, "list")
		require.Equal(t, 2, code, "%s: %s", name, errOut)
		require.Contains(t, errOut, "--shards", name)
	}
	_, errOut, code = cli(t, nil, "--shards", filepath.Join(dir, "absent.json"), "list")
	require.Equal(t, 2, code, errOut)
}
