package etcd

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	authority "github.com/zlink-systems/authority"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Per-operation overhead added to the byte estimate of a request (protobuf
// framing, the raft entry header).
const opOverhead = 48

// txn collects one Txn: all conditions in cmps, the success ops in then, the
// conflict reads in els, and an estimate of the request size.
type txn struct {
	cmps  []clientv3.Cmp
	then  []clientv3.Op
	els   []clientv3.Op
	bytes int
	seen  map[string]bool // keys written by then (etcd refuses duplicates)
	// touches are the capacity epoch keys of the nodes whose capacity
	// entries the Txn writes, each put once after then (see touch).
	touches []string
	// alone marks a Txn fenced on a capacity epoch: it is never merged
	// with other writes (writebatch.go), since they may touch that epoch.
	alone bool
}

func (t *txn) cmp(c clientv3.Cmp) {
	t.cmps = append(t.cmps, c)
	t.bytes += len(c.KeyBytes()) + len(c.GetCompare().RangeEnd) + opOverhead
}

func (t *txn) put(key, value string, opts ...clientv3.OpOption) {
	t.then = append(t.then, clientv3.OpPut(key, value, opts...))
	t.bytes += len(key) + len(value) + opOverhead
	t.mark(key)
}

func (t *txn) del(key string) {
	t.then = append(t.then, clientv3.OpDelete(key))
	t.bytes += len(key) + opOverhead
	t.mark(key)
}

// touch puts a node's capacity epoch key (layout.capacityEpoch) once in
// this Txn. Every Txn that puts or deletes a capacity entry touches its
// node's epoch, so the epoch's ModRevision is the revision of the node's
// last capacity change: a reservation fences on that one key instead of
// on the node's whole capacity range.
func (t *txn) touch(key string) {
	if slices.Contains(t.touches, key) {
		return
	}
	t.touches = append(t.touches, key)
	t.bytes += len(key) + opOverhead
}

// thenOps returns the Txn's success ops: then, then the epoch touches.
func (t *txn) thenOps() []clientv3.Op {
	if len(t.touches) == 0 {
		return t.then
	}
	ops := slices.Clip(t.then)
	for _, k := range t.touches {
		ops = append(ops, clientv3.OpPut(k, ""))
	}
	return ops
}

func (t *txn) mark(key string) {
	if t.seen == nil {
		t.seen = map[string]bool{}
	}
	if t.seen[key] {
		panic(fmt.Sprintf("etcd provider bug: key %q written twice in one txn", key))
	}
	t.seen[key] = true
}

func (t *txn) orGet(key string, opts ...clientv3.OpOption) {
	t.els = append(t.els, clientv3.OpGet(key, opts...))
	t.bytes += len(key) + opOverhead
}

// clone returns a copy of t that can be extended without changing t.
func (t *txn) clone() *txn {
	c := &txn{cmps: slices.Clone(t.cmps), then: slices.Clone(t.then), els: slices.Clone(t.els), bytes: t.bytes,
		touches: slices.Clone(t.touches), alone: t.alone}
	if t.seen != nil {
		c.seen = maps.Clone(t.seen)
	}
	return c
}

// ops is the number etcd compares against --max-txn-ops.
func (t *txn) ops() int { return max(len(t.cmps), len(t.then)+len(t.touches), len(t.els)) }

// check refuses a Txn that cannot fit the configured limits.
func (s *Store) check(t *txn, what string) error {
	if n := t.ops(); n > s.maxOps {
		return limitError(flagMaxTxnOps, fmt.Sprintf("%s needs %d operations in one transaction, more than %d; it", what, n, s.maxOps), nil)
	}
	if t.bytes > s.maxBytes {
		return limitError(flagMaxRequestBytes, fmt.Sprintf("%s needs a request of about %d bytes, more than %d; it", what, t.bytes, s.maxBytes), nil)
	}
	return nil
}

// sendWrite sends t after checking it fits, alone or batched with concurrent
// writes (writebatch.go). The caller checks Succeeded.
func (s *Store) sendWrite(ctx context.Context, t *txn, what string) (*clientv3.TxnResponse, error) {
	if err := s.check(t, what); err != nil {
		return nil, err
	}
	resp, err := s.batch.commit(ctx, t)
	if err == nil && !resp.Succeeded {
		s.explainFailure(ctx, t, resp)
	}
	return resp, err
}

// send sends t as one Txn.
func (s *Store) send(ctx context.Context, t *txn) (*clientv3.TxnResponse, error) {
	ctx, cancel := s.requestContext(ctx)
	defer cancel()
	ctx, end := s.obs.RoundTrip(ctx, "etcd.Txn", t.ops())
	resp, err := s.kv.Txn(ctx).If(t.cmps...).Then(t.thenOps()...).Else(t.els...).Commit()
	if err != nil {
		err = s.txnFailed(err, len(t.then) > 0)
	}
	end(err)
	s.obs.Metrics().TxnSent(t.ops(), t.bytes, err == nil && resp.Succeeded, err, errors.Is(err, authority.ErrOutcomeUnknown))
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// read sends a read-only Txn of gets (one round trip, one revision).
func (s *Store) read(ctx context.Context, ops ...clientv3.Op) (*clientv3.TxnResponse, error) {
	ctx, cancel := s.requestContext(ctx)
	defer cancel()
	ctx, end := s.obs.RoundTrip(ctx, "etcd.Txn", len(ops))
	resp, err := s.kv.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		err = s.txnFailed(err, false)
	}
	end(err)
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// reads are the key-values a Txn's single-key reads returned, by key: a
// read is found by the key it read, never by where its response sits (as
// etcd's stm.go does). A key that was read and is absent has no entry.
type keyedReads map[string]*mvccpbKV

// readsOf indexes every range response of resp by key.
func readsOf(resp *clientv3.TxnResponse) keyedReads {
	m := make(keyedReads, len(resp.Responses))
	for _, r := range resp.Responses {
		for _, kv := range r.GetResponseRange().GetKvs() {
			m[string(kv.Key)] = kv
		}
	}
	return m
}

// kvNamed returns the key-value a single-key read of key in resp returned
// (nil: absent, or not read).
func kvNamed(resp *clientv3.TxnResponse, key string) *mvccpbKV {
	for _, r := range resp.Responses {
		for _, kv := range r.GetResponseRange().GetKvs() {
			if string(kv.Key) == key {
				return kv
			}
		}
	}
	return nil
}

// rangeRead is a handle to one range read of a Txn: what adds the read
// returns it, and the read's response is found through it.
type rangeRead struct{ at int }

// addRead appends op to ops and returns the handle of its response.
func addRead(ops []clientv3.Op, op clientv3.Op) ([]clientv3.Op, rangeRead) {
	return append(ops, op), rangeRead{at: len(ops)}
}

// in returns the handle's response in resp.
func (h rangeRead) in(resp *clientv3.TxnResponse) *etcdserverpb.RangeResponse {
	return resp.Responses[h.at].GetResponseRange()
}

// thenPart is the part of a merged Txn's success responses that answers one
// member's n ops, the member's first op at off (writebatch.go).
func thenPart(resp *clientv3.TxnResponse, off, n int) *clientv3.TxnResponse {
	return &clientv3.TxnResponse{
		Header:    resp.Header,
		Succeeded: true,
		Responses: slices.Clone(resp.Responses[off : off+n]),
	}
}

type mvccpbKV = mvccpb.KeyValue

// modRevIs compares a key's ModRevision (0: the key is absent).
func modRevIs(key string, rev int64) clientv3.Cmp {
	return clientv3.Compare(clientv3.ModRevision(key), "=", rev)
}

func opGet(key string) clientv3.Op { return clientv3.OpGet(key) }
