package txnkit

import (
	"bytes"
	"strconv"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Explain evaluates the compares of t, a Txn that failed with resp, to
// name the one that did not hold (etcd does not say). It decides first on
// the keys t's own Else read, at no cost: failed is the first compare that
// fails on them. When none fails there, unread are the compares the Else
// did not decide (ranges, keys not read, values read keys only), in order,
// for the caller to read again and decide with Holds. A compare that fails
// now is the one that failed unless the keys changed again in between.
func Explain(t *Txn, resp *clientv3.TxnResponse) (failed *pb.Compare, unread []*pb.Compare) {
	inElse, got := elseReadKeys(t), ReadsOf(resp)
	for i := range t.Cmps {
		c := t.Cmps[i].GetCompare()
		keysOnly, read := inElse[string(c.Key)]
		if !read || len(c.RangeEnd) > 0 || (keysOnly && c.Target == pb.Compare_VALUE) {
			unread = append(unread, c)
			continue
		}
		var kvs []*mvccpb.KeyValue
		if kv := got[string(c.Key)]; kv != nil {
			kvs = append(kvs, kv)
		}
		if !Holds(c, kvs) {
			return c, nil
		}
	}
	return nil, unread
}

// ReadOf is the read that decides c: its key, or its range.
func ReadOf(c *pb.Compare) clientv3.Op {
	var opts []clientv3.OpOption
	if len(c.RangeEnd) > 0 {
		opts = append(opts, clientv3.WithRange(string(c.RangeEnd)))
	}
	return clientv3.OpGet(string(c.Key), opts...)
}

// elseReadKeys returns the keys t's Else reads one by one with their values
// or keys only (the value: keys only); ranges and counts are left out.
func elseReadKeys(t *Txn) map[string]bool {
	keys := make(map[string]bool, len(t.Els))
	for _, op := range t.Els {
		if op.IsGet() && len(op.RangeBytes()) == 0 && !op.IsCountOnly() {
			keys[string(op.KeyBytes())] = op.IsKeysOnly()
		}
	}
	return keys
}

// Holds evaluates c as etcd does on kvs, the keys of its range: a missing
// key compares as zero (and a value compare on it fails).
func Holds(c *pb.Compare, kvs []*mvccpb.KeyValue) bool {
	if len(kvs) == 0 {
		if c.Target == pb.Compare_VALUE {
			return false
		}
		kvs = []*mvccpb.KeyValue{{}}
	}
	for _, kv := range kvs {
		if !cmpResult(c.Result, cmpOrder(c, kv)) {
			return false
		}
	}
	return true
}

// cmpOrder compares kv's target field with c's operand (-1, 0, 1).
func cmpOrder(c *pb.Compare, kv *mvccpb.KeyValue) int {
	var have, want int64
	switch c.Target {
	case pb.Compare_VERSION:
		have, want = kv.Version, c.GetVersion()
	case pb.Compare_CREATE:
		have, want = kv.CreateRevision, c.GetCreateRevision()
	case pb.Compare_MOD:
		have, want = kv.ModRevision, c.GetModRevision()
	case pb.Compare_LEASE:
		have, want = kv.Lease, c.GetLease()
	case pb.Compare_VALUE:
		return bytes.Compare(kv.Value, c.GetValue())
	}
	switch {
	case have < want:
		return -1
	case have > want:
		return 1
	}
	return 0
}

func cmpResult(r pb.Compare_CompareResult, order int) bool {
	switch r {
	case pb.Compare_EQUAL:
		return order == 0
	case pb.Compare_GREATER:
		return order > 0
	case pb.Compare_LESS:
		return order < 0
	case pb.Compare_NOT_EQUAL:
		return order != 0
	}
	return false
}

// cmpID identifies a compare: its key, target, operator and operand.
func cmpID(c *clientv3.Cmp) string {
	pc := c.GetCompare()
	var operand int64
	switch pc.Target {
	case pb.Compare_MOD:
		operand = pc.GetModRevision()
	case pb.Compare_CREATE:
		operand = pc.GetCreateRevision()
	case pb.Compare_VERSION:
		operand = pc.GetVersion()
	case pb.Compare_LEASE:
		operand = pc.GetLease()
	default: // a value compare
		return string(pc.Key) + "\x00value\x00" + string(pc.GetValue()) + "\x00" + pc.Result.String()
	}
	return string(pc.Key) + "\x00" + string(pc.RangeEnd) + "\x00" + pc.Target.String() + pc.Result.String() + strconv.FormatInt(operand, 10)
}
