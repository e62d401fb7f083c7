package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"

	authority "github.com/zlink-systems/authority"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/sharded"
)

// shardCommands are the commands that take --shards: they read every shard
// of a sharded store (provider/sharded).
var shardCommands = []string{"list", "get", "doctor"}

// shardSet is the file --shards names: the clusters of a sharded store, in
// the shard map's order, for example
//
//	{"shards": [
//	  {"endpoints": ["etcd-a1:2379"], "namespace": "/zlink/authority/v1/", "cacert": "a-ca.pem"},
//	  {"endpoints": ["etcd-b1:2379"], "user": "reader", "passwordEnv": "B_PASSWORD"}
//	]}
//
// A shard without a namespace takes --namespace; its password is read from
// the environment variable passwordEnv names, never from the file.
type shardSet struct {
	Epoch  int64        `json:"epoch,omitempty"`
	Shards []shardEntry `json:"shards"`
}

// shardEntry is one shard's connection settings.
type shardEntry struct {
	Endpoints   []string `json:"endpoints"`
	Namespace   string   `json:"namespace,omitempty"`
	CACert      string   `json:"cacert,omitempty"`
	Cert        string   `json:"cert,omitempty"`
	Key         string   `json:"key,omitempty"`
	User        string   `json:"user,omitempty"`
	PasswordEnv string   `json:"passwordEnv,omitempty"`
}

// loadShards reads and checks --shards' file; every problem is a usage
// error naming the file.
func (g *globals) loadShards(cmd *cobra.Command) error {
	if g.shardsFile == "" {
		return nil
	}
	bad := func(format string, args ...any) error {
		return usageError(fmt.Errorf("--shards %s: "+format, append([]any{g.shardsFile}, args...)...))
	}
	if !containsString(shardCommands, cmd.Name()) {
		return bad("%s does not take --shards (only %s)", cmd.Name(), strings.Join(shardCommands, ", "))
	}
	raw, err := os.ReadFile(g.shardsFile)
	if err != nil {
		return bad("%v", err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var set shardSet
	if err := dec.Decode(&set); err != nil || dec.More() {
		return bad("not a shard list (JSON {\"shards\": [{\"endpoints\": [...], ...}]}): %v", err)
	}
	if len(set.Shards) < 1 || len(set.Shards) > schema.MaxShards || set.Epoch < 0 {
		return bad("%d shards and epoch %d: want 1 to %d shards and an epoch ≥ 1 (0: 1)", len(set.Shards), set.Epoch, schema.MaxShards)
	}
	for i := range set.Shards {
		e := &set.Shards[i]
		if e.Namespace == "" {
			e.Namespace = g.namespace
		}
		switch {
		case len(e.Endpoints) == 0 || containsString(e.Endpoints, ""):
			return bad("shard %d has no endpoints (or an empty one)", i)
		case schema.ValidateNamespace(e.Namespace) != nil:
			return bad("shard %d: %v", i, schema.ValidateNamespace(e.Namespace))
		case (e.Cert == "") != (e.Key == ""):
			return bad("shard %d: cert and key must be given together", i)
		case e.PasswordEnv != "" && g.env(e.PasswordEnv) == "":
			return bad("shard %d: the environment variable %s (passwordEnv) is not set", i, e.PasswordEnv)
		}
	}
	g.shards = &set
	return nil
}

func containsString(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// asShard returns g with shard i's connection settings, for dialling it.
func (g *globals) asShard(i int) *globals {
	e, c := g.shards.Shards[i], *g
	c.endpoints, c.namespace, c.cacert, c.cert, c.key, c.user, c.password = e.Endpoints, e.Namespace, e.CACert, e.Cert, e.Key, e.User, ""
	if e.PasswordEnv != "" {
		c.password = g.env(e.PasswordEnv)
	}
	return &c
}

// withShardedStore opens a read-only sharded store over --shards' clusters
// (each dialled as the flags would dial one, so a connection failure names
// its cause and its shard) and runs f on it.
func (g *globals) withShardedStore(cmd *cobra.Command, f func(ctx context.Context, s *sharded.Store) error) error {
	ctx, cancel := g.commandContext(cmd.Context())
	defer cancel()
	s, closeAll, err := g.openSharded(ctx)
	if err != nil {
		return err
	}
	defer closeAll()
	return f(ctx, s)
}

// openSharded dials every shard and opens the read-only sharded store.
func (g *globals) openSharded(ctx context.Context) (*sharded.Store, func(), error) {
	var clients []*clientv3.Client
	closeClients := func() {
		for _, c := range clients {
			_ = c.Close()
		}
	}
	cfg := sharded.Config{Epoch: g.shards.Epoch, ReadOnly: true, Role: "authorityctl"}
	for i, e := range g.shards.Shards {
		c, _, err := g.asShard(i).dial(ctx, false)
		if err != nil {
			closeClients()
			return nil, nil, fmt.Errorf("shard %d (%s): %w", i, strings.Join(e.Endpoints, ","), err)
		}
		clients = append(clients, c)
		cfg.Shards = append(cfg.Shards, etcdstore.Config{Client: c, Namespace: e.Namespace})
	}
	s, err := sharded.New(ctx, cfg)
	if err != nil {
		closeClients()
		if errors.Is(err, authority.ErrAccessDenied) {
			err = connectError(err)
		}
		return nil, nil, err
	}
	return s, func() { _ = s.Close(); closeClients() }, nil
}

// runDoctorShards runs doctor's checks on every shard (each named "shard
// N: ...") and checks the shard map: every shard holds the map --shards
// describes.
func runDoctorShards(ctx context.Context, g *globals, maxTxnOps, maxRequestBytes int, noProbe bool) error {
	ctx, cancel := g.commandContext(ctx)
	defer cancel()
	d := &doctorView{Endpoints: []memberView{}, Checks: []checkView{}}
	for i := range g.shards.Shards {
		gi := g.asShard(i)
		c, statuses, err := gi.dial(ctx, true)
		if err != nil {
			d.add(fmt.Sprintf("shard %d", i), checkFail, "%v", err)
			continue
		}
		one := &doctorView{Endpoints: []memberView{}, Checks: []checkView{}}
		doctorChecks(ctx, gi, c, statuses, one, maxTxnOps, maxRequestBytes, noProbe)
		_ = c.Close()
		d.Endpoints = append(d.Endpoints, one.Endpoints...)
		for _, ch := range one.Checks {
			ch.Check = fmt.Sprintf("shard %d: %s", i, ch.Check)
			d.Checks = append(d.Checks, ch)
		}
	}
	if s, closeAll, err := g.openSharded(ctx); err != nil {
		d.add("shard map", checkFail, "%v", err)
	} else {
		m := s.Map()
		d.add("shard map", checkOK, "every shard holds the map of %d shards (epoch %d, hash %s)%s",
			len(m.Shards), m.Epoch, m.Hash, mapNote(len(m.Shards)))
		closeAll()
	}
	doctorLeaseCheckpoint(d)
	return finishDoctor(g, d)
}

func mapNote(shards int) string {
	if shards == 1 {
		return ", or a single cluster's namespace without one"
	}
	return ""
}
