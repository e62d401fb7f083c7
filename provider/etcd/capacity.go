package etcd

import (
	"context"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/provider/etcd/internal/txnkit"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// nodeUsage is the capacity held on one node lifecycle, summed from its
// capacity index entries, per counter.
type nodeUsage struct {
	reserved map[authority.CapacityCounter]int64
	active   map[authority.CapacityCounter]int64
}

func (s *Store) sumUsage(node authority.NodeDescriptor, lifecycle int64, kvs []*mvccpb.KeyValue) (nodeUsage, error) {
	u := nodeUsage{reserved: map[authority.CapacityCounter]int64{}, active: map[authority.CapacityCounter]int64{}}
	prefix := s.keys.CapacityNode(node, lifecycle)
	for _, kv := range kvs {
		st, c, err := schema.DecodeNodeCapacityEntry(prefix, kv)
		if err != nil {
			return u, err
		}
		into := u.active
		if st == authority.AllocationReserved {
			into = u.reserved
		}
		for _, e := range authority.CapacityEntries(node, lifecycle, c) {
			into[e.Counter] += e.Count
		}
	}
	return u, nil
}

// capacityPage is how many capacity entries one range request reads: a
// crowded node's entries are read in pages (capacityKvs), so no response
// grows with the node (the client refuses one over its receive limit).
var capacityPage int64 = 1000

// capacityRangeOp reads the first capacityPage capacity entries of a node
// lifecycle; capacityKvs reads the rest.
func (s *Store) capacityRangeOp(node authority.NodeDescriptor, lifecycle int64) clientv3.Op {
	p := s.keys.CapacityNode(node, lifecycle)
	return clientv3.OpGet(p, clientv3.WithRange(prefixEnd(p)), clientv3.WithLimit(capacityPage))
}

// capacityKvs returns every capacity entry of a node lifecycle at resp's
// revision: the response of the capacityRangeOp read h and, when it was cut
// at capacityPage, the following pages read at the same revision.
func (s *Store) capacityKvs(ctx context.Context, resp *clientv3.TxnResponse, h txnkit.RangeRead, node authority.NodeDescriptor, lifecycle int64) ([]*mvccpb.KeyValue, error) {
	r := h.In(resp)
	if !r.More || len(r.Kvs) == 0 {
		return r.Kvs, nil
	}
	rctx, cancel := s.requestContext(ctx)
	defer cancel()
	rest, err := s.readRest(rctx, string(r.Kvs[len(r.Kvs)-1].Key), prefixEnd(s.keys.CapacityNode(node, lifecycle)), resp.Header.Revision, capacityPage)
	if err != nil {
		return nil, mapError(err, false)
	}
	return append(r.Kvs[:len(r.Kvs):len(r.Kvs)], rest...), nil
}

// fenceCapacity adds to t the condition that no capacity entry of the node
// lifecycle changed since the read that decided on its usage: the node's
// capacity epoch (put by every such change) still has the ModRevision epoch
// it had at that read (0: absent). One key, so etcd checks it in O(1)
// however many entries the node holds.
//
// The compare is an equality, not "no newer than the read", because
// PruneCapacityEpochs deletes the epoch of a node whose capacity range is
// empty: a deleted epoch has ModRevision 0, which "< read+1" would accept
// after entries the decision counted were removed. With equality, a
// decision on a present epoch fails once it is pruned, and a decision on an
// absent epoch (an empty range) holds only while it is still absent, which
// means the range is still empty (a change would have put the epoch). That
// needs every node with entries to have an epoch: a read that finds entries
// an earlier build wrote without one puts it before deciding (usageAt).
//
// A Txn so fenced is sent alone, never merged with writes that may touch the
// same epoch.
func (s *Store) fenceCapacity(t *txnkit.Txn, node authority.NodeDescriptor, lifecycle int64, epoch int64) {
	t.Cmp(modRevIs(s.keys.CapacityEpoch(node, lifecycle), epoch))
	t.Alone = true
}

// touchCapacity records in t that it changes a capacity entry of alloc's
// node lifecycle.
func (s *Store) touchCapacity(t *txnkit.Txn, alloc authority.PlacementAllocation) {
	t.Touch(s.keys.CapacityEpoch(alloc.Descriptor, alloc.DescriptorLifecycleGeneration))
}

// fits asks the policy whether alloc fits next to usage.
func fits(policy authority.CapacityPolicy, alloc authority.PlacementAllocation, u nodeUsage) bool {
	if policy == nil {
		return true
	}
	counters := authority.UsageCounters(alloc.Descriptor, alloc.DescriptorLifecycleGeneration, alloc.Capacity)
	reserved := make([]int64, len(counters))
	active := make([]int64, len(counters))
	for i, c := range counters {
		reserved[i], active[i] = u.reserved[c], u.active[c]
	}
	return policy.PlacementCapacityAvailable(alloc.Descriptor, alloc.Capacity.Clone(),
		authority.UsageVector(alloc.Capacity, reserved), authority.UsageVector(alloc.Capacity, active))
}

// capacityUsage returns the active and reserved counts of one counter of a
// node lifecycle.
func (s *Store) capacityUsage(ctx context.Context, node authority.NodeDescriptor, lifecycleGeneration int64, objectKind authority.ObjectKind, stableType string) (authority.CapacityUsage, error) {
	if err := s.begin(ctx); err != nil {
		return authority.CapacityUsage{}, err
	}
	u, err := s.nodeUsageNow(ctx, node, lifecycleGeneration)
	if err != nil {
		return authority.CapacityUsage{}, err
	}
	c := authority.UsageCounter(node, lifecycleGeneration, objectKind, stableType)
	return authority.CapacityUsage{Active: u.active[c], Reserved: u.reserved[c]}, nil
}

// nodeUsageNow returns the usage of a node lifecycle at a read of its
// capacity epoch: from its usage watch when it is watched, else summed from
// its capacity range, which starts the watch (usagewatch.go), as a
// reservation's decision does. So a store that answered CapacityUsage for a
// node decides its next reservations there without reading the range.
func (s *Store) nodeUsageNow(ctx context.Context, node authority.NodeDescriptor, lifecycle int64) (nodeUsage, error) {
	const attempts = 4
	fullRange := false
	for attempt := 1; ; attempt++ {
		ops, ur := s.addUsageReads(nil, node, lifecycle, fullRange)
		resp, err := s.read(ctx, ops...)
		if err != nil {
			return nodeUsage{}, err
		}
		u, _, ok, err := s.usageAt(ctx, resp, ur)
		if err != nil || ok {
			return u, err
		}
		if attempt == attempts {
			return nodeUsage{}, authority.Wrap(authority.ErrUnavailable,
				"capacity usage: the node's capacity kept changing or was compacted between reads", errContention)
		}
		// the watch moved past the read, or the range's pages were
		// compacted: read again, with the range after the first time
		fullRange = attempt >= 2
	}
}
