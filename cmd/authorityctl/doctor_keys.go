package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/provider/etcd/preflight"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// maxNamedKeys bounds the undecodable keys doctor names in its detail.
const maxNamedKeys = 5

// doctorKeys decodes every key of the namespace with the provider's codec
// and reports the ones that do not decode (a foreign or corrupt value under
// rows/, owners/, capacity/, …): list, owners and capacity leave them out
// and fail.
func doctorKeys(ctx context.Context, c *clientv3.Client, ns string, d *doctorView) {
	kvs, _, err := rangeAll(ctx, c, ns)
	if err != nil {
		d.add("keys", checkFail, "cannot read the namespace %s: %v", ns, err)
		return
	}
	var bad []string
	for _, kv := range kvs {
		if _, err := schema.DecodeEntry(ns, kv); err != nil {
			if !errors.Is(err, authority.ErrCorrupt) {
				err = fmt.Errorf("key %q: %w", kv.Key, err)
			}
			bad = append(bad, err.Error())
		}
	}
	switch {
	case len(bad) == 0:
		d.add("keys", checkOK, "all %d keys of %s decode", len(kvs), ns)
	case len(bad) <= maxNamedKeys:
		d.add("keys", checkFail, "%d of %d keys of %s do not decode: %s", len(bad), len(kvs), ns, strings.Join(bad, "; "))
	default:
		d.add("keys", checkFail, "%d of %d keys of %s do not decode: %s; and %d more (authorityctl list/owners/capacity name them)",
			len(bad), len(kvs), ns, strings.Join(bad[:maxNamedKeys], "; "), len(bad)-maxNamedKeys)
	}
}

// doctorServerWarnings reports the provider's warning about each member's
// etcd version (known watch and lease bugs: Store.ServerWarning).
func doctorServerWarnings(d *doctorView) {
	warned := map[string]bool{}
	for _, m := range d.Endpoints {
		if m.Version == "" || warned[m.Version] {
			continue
		}
		warned[m.Version] = true
		if w := preflight.ServerVersionWarning(m.Version); w != "" {
			d.add("server version", checkWarn, "%s (%s)", w, m.Endpoint)
		}
	}
}
