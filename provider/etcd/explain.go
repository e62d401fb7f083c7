package etcd

import (
	"bytes"
	"context"
	"errors"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/zlink-systems/authority/internal/observe"
	"github.com/zlink-systems/authority/provider/etcd/schema"
)

// txnFailed maps the error of a Txn the store sent (write: it had writes)
// and records what an operator needs to see of it.
func (s *Store) txnFailed(err error, write bool) error {
	if errors.Is(err, rpctypes.ErrNoSpace) || errors.Is(err, rpctypes.ErrGRPCNoSpace) {
		s.obs.Metrics().NoSpace()
		s.obs.Logger().Warn("etcd is over its backend quota (NOSPACE alarm): writes are refused until compaction, defrag and alarm disarm")
	}
	mapped := mapError(err, write)
	if errors.Is(mapped, ErrClusterRegressed) {
		s.obs.Logger().Error("the etcd cluster went back in time or changed: every request is refused until the store is reopened", "error", err)
	}
	return mapped
}

// explainFailure names the compare of t that did not hold, on ctx's span
// (attribute authority.failed_compare) and in the failed-compare metric. etcd
// does not say which compare failed, so the store evaluates the compares
// itself: first on the keys the failed Txn's own Else read (resp), at no
// cost; only when none of those fails does it read the other compared keys,
// once, and only when something will show the answer. A compare that fails
// now is the one that failed unless the keys changed again in between.
func (s *Store) explainFailure(ctx context.Context, t *txn, resp *clientv3.TxnResponse) {
	if len(t.cmps) == 0 || !s.obs.Explaining(ctx) {
		return
	}
	inElse, got := elseReadKeys(t), readsOf(resp)
	var unread []*pb.Compare
	for i := range t.cmps {
		c := t.cmps[i].GetCompare()
		keysOnly, read := inElse[string(c.Key)]
		if !read || len(c.RangeEnd) > 0 || (keysOnly && c.Target == pb.Compare_VALUE) {
			unread = append(unread, c)
			continue
		}
		var kvs []*mvccpbKV
		if kv := got[string(c.Key)]; kv != nil {
			kvs = append(kvs, kv)
		}
		if !cmpHolds(c, kvs) {
			s.obs.Refused(ctx, compareKind(s.keys, string(c.Key)))
			return
		}
	}
	if len(unread) == 0 {
		return // every compare holds now: the keys changed back
	}
	var gets []clientv3.Op
	reads := make([]rangeRead, len(unread))
	for i, c := range unread {
		var opts []clientv3.OpOption
		if len(c.RangeEnd) > 0 {
			opts = append(opts, clientv3.WithRange(string(c.RangeEnd)))
		}
		gets, reads[i] = addRead(gets, clientv3.OpGet(string(c.Key), opts...))
	}
	again, err := s.read(ctx, gets...)
	if err != nil {
		return
	}
	for i, c := range unread {
		if !cmpHolds(c, reads[i].in(again).Kvs) {
			s.obs.Refused(ctx, compareKind(s.keys, string(c.Key)))
			return
		}
	}
}

// elseReadKeys returns the keys t's Else reads one by one with their values
// or keys only (the value: keys only); ranges and counts are left out.
func elseReadKeys(t *txn) map[string]bool {
	keys := make(map[string]bool, len(t.els))
	for _, op := range t.els {
		if op.IsGet() && len(op.RangeBytes()) == 0 && !op.IsCountOnly() {
			keys[string(op.KeyBytes())] = op.IsKeysOnly()
		}
	}
	return keys
}

// cmpHolds evaluates c as etcd does: over every key of its range, a missing
// key comparing as zero (and a value compare on it failing).
func cmpHolds(c *pb.Compare, kvs []*mvccpb.KeyValue) bool {
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

// compareKind names what a compare on key guards, by the key's layout
// segment.
func compareKind(l schema.Layout, key string) observe.Compare {
	switch l.Segment(key) {
	case schema.SegOwners, schema.SegOwnerGens:
		return observe.CompareOwnerLease
	case schema.SegCapacity, schema.SegCapacityEpochs:
		return observe.CompareCapacityEpoch
	case schema.SegAggregates:
		return observe.CompareAggregateRecord
	case schema.SegReservations, schema.SegTerminals:
		return observe.CompareReservation
	}
	return observe.CompareRowVersion
}
