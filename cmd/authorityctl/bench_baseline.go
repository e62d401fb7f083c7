package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// baseline is the raw-etcd op of the same shape as a workload's op: the
// etcd round trips the workload's op needs at least, without the store.
type baseline struct {
	// shape says what one op of it is.
	shape string
	op    benchOp
}

// baselineOf returns the baseline of workload, or false when no raw op has
// its shape (aggregate: its Txns span rows, records and capacity entries;
// mixed: several shapes), so that no ratio compares unlike things.
func baselineOf(workload string, c *clientv3.Client, ns, value string) (baseline, bool) {
	raw := ns + "raw/"
	switch workload {
	case workloadReserveCommit:
		return baseline{shape: fmt.Sprintf("two Txns on a new key: create it if absent, then put it if unchanged (%d-byte value)", len(value)),
			op: rawCreateUpdateOp(c, raw, value)}, true
	case workloadCAS:
		return baseline{shape: fmt.Sprintf("one Txn: put a %d-byte value if the key is unchanged", len(value)),
			op: rawTxnOp(c, raw, value)}, true
	case workloadList:
		return baseline{shape: fmt.Sprintf("one range read of %d of the same rows", benchPage),
			op: rawPagesOp(c, schema.Prefix(ns, schema.EntryRow)+authority.KindPrefix(authority.ObjectUserSpot))}, true
	}
	return baseline{}, false
}

// rawCreateUpdateOp is reserve-commit's baseline: a Txn creating a new key,
// then one updating it under a compare of its mod revision.
func rawCreateUpdateOp(c *clientv3.Client, prefix, value string) benchOp {
	return func(ctx context.Context, client, i int) error {
		key := prefix + strconv.Itoa(client) + "/" + strconv.Itoa(i)
		resp, err := c.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).Then(clientv3.OpPut(key, value)).Commit()
		if err != nil {
			return err
		}
		if !resp.Succeeded {
			return fmt.Errorf("raw create of %s: compare failed", key)
		}
		resp, err = c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", resp.Header.Revision)).Then(clientv3.OpPut(key, value)).Commit()
		if err == nil && !resp.Succeeded {
			err = fmt.Errorf("raw update of %s: compare failed", key)
		}
		return err
	}
}

// rawPagesOp is list's baseline: range reads of benchPage keys under
// prefix, each client going on after its last key and starting over at the
// end.
func rawPagesOp(c *clientv3.Client, prefix string) benchOp {
	var mu sync.Mutex
	after := map[int]string{}
	return func(ctx context.Context, client, _ int) error {
		mu.Lock()
		from := after[client]
		mu.Unlock()
		if from == "" {
			from = prefix
		}
		resp, err := c.Get(ctx, from, clientv3.WithRange(clientv3.GetPrefixRangeEnd(prefix)), clientv3.WithLimit(benchPage))
		if err != nil {
			return err
		}
		next := ""
		if resp.More && len(resp.Kvs) > 0 {
			next = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
		}
		mu.Lock()
		after[client] = next
		mu.Unlock()
		return nil
	}
}
