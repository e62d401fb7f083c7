package main

import (
	"context"

	"github.com/zlink-systems/authority/provider/etcd/schema"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// listedEntry is one stored entry a listing read: its key-value, its decoded
// form, and the revision the listing read at.
type listedEntry struct {
	kv    *mvccpb.KeyValue
	entry schema.Entry
	rev   int64
}

// entryQuery is what listEntries reads: every key under prefix (with opts,
// e.g. keys only). An entry the provider cannot decode fails the listing,
// unless undecodable is set: it then gets the error and the entry is left
// out.
type entryQuery struct {
	prefix      string
	opts        []clientv3.OpOption
	undecodable func(error)
}

// listEntries reads the entries of q at one revision, decodes each with the
// schema package's DecodeEntry (the one definition of the stored format), and
// returns view of each in key order; view's ok false leaves an entry out
// (for example an expired record awaiting its lease).
func listEntries[T any](ctx context.Context, c *clientv3.Client, ns string, q entryQuery, view func(listedEntry) (item T, ok bool, err error)) ([]T, error) {
	kvs, rev, err := rangeAll(ctx, c, q.prefix, q.opts...)
	if err != nil {
		return nil, err
	}
	out := []T{}
	for _, kv := range kvs {
		e, err := schema.DecodeEntry(ns, kv)
		if err != nil {
			if q.undecodable == nil {
				return nil, err
			}
			q.undecodable(err)
			continue
		}
		item, ok, err := view(listedEntry{kv: kv, entry: e, rev: rev})
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, item)
		}
	}
	return out, nil
}

// addRows adds one table row per item with add and returns t.
func addRows[T any](t *table, items []T, add func(*table, T)) *table {
	for _, it := range items {
		add(t, it)
	}
	return t
}

// renderItems writes items as {"items": [...]} (json, yaml) or as t with one
// row per item added by add (table, wide); no item is foundNothing.
func renderItems[T any](g *globals, items []T, t *table, add func(*table, T)) error {
	g.foundNothing = len(items) == 0
	return render(g.stdout, g.output, itemsView[T]{Items: items}, addRows(t, items, add))
}
