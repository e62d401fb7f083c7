package txnkit

import (
	"slices"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Reads are the key-values a Txn's single-key reads returned, by key: a
// read is found by the key it read, never by where its response sits (as
// etcd's stm.go does). A key that was read and is absent has no entry.
type Reads map[string]*mvccpb.KeyValue

// ReadsOf indexes every range response of resp by key.
func ReadsOf(resp *clientv3.TxnResponse) Reads {
	m := make(Reads, len(resp.Responses))
	for _, r := range resp.Responses {
		for _, kv := range r.GetResponseRange().GetKvs() {
			m[string(kv.Key)] = kv
		}
	}
	return m
}

// KVNamed returns the key-value a single-key read of key in resp returned
// (nil: absent, or not read).
func KVNamed(resp *clientv3.TxnResponse, key string) *mvccpb.KeyValue {
	for _, r := range resp.Responses {
		for _, kv := range r.GetResponseRange().GetKvs() {
			if string(kv.Key) == key {
				return kv
			}
		}
	}
	return nil
}

// RangeRead is a handle to one range read of a Txn: AddRead returns it, and
// the read's response is found through it.
type RangeRead struct{ at int }

// AddRead appends op to ops and returns the handle of its response.
func AddRead(ops []clientv3.Op, op clientv3.Op) ([]clientv3.Op, RangeRead) {
	return append(ops, op), RangeRead{at: len(ops)}
}

// Shift returns the handle of the same read after n ops were put before it.
func (h RangeRead) Shift(n int) RangeRead { return RangeRead{at: h.at + n} }

// In returns the handle's response in resp.
func (h RangeRead) In(resp *clientv3.TxnResponse) *etcdserverpb.RangeResponse {
	return resp.Responses[h.at].GetResponseRange()
}

// thenPart is the part of a merged Txn's success responses that answers one
// member's n ops, the member's first op at off.
func thenPart(resp *clientv3.TxnResponse, off, n int) *clientv3.TxnResponse {
	return &clientv3.TxnResponse{
		Header:    resp.Header,
		Succeeded: true,
		Responses: slices.Clone(resp.Responses[off : off+n]),
	}
}
