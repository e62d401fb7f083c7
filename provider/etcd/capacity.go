package etcd

import (
	"context"
	"strings"

	authority "github.com/zlink-systems/authority"
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
	prefix := s.keys.capacityNode(node, lifecycle)
	for _, kv := range kvs {
		rest := strings.TrimPrefix(string(kv.Key), prefix)
		if !strings.HasPrefix(rest, "row/") && !strings.HasPrefix(rest, "agg/") {
			return u, corrupt(string(kv.Key), nil)
		}
		st, c, err := decodeCapacityValue(kv.Value)
		if err != nil {
			return u, corrupt(string(kv.Key), err)
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

// capacityRangeOp reads every capacity entry of a node lifecycle.
func (s *Store) capacityRangeOp(node authority.NodeDescriptor, lifecycle int64) clientv3.Op {
	p := s.keys.capacityNode(node, lifecycle)
	return clientv3.OpGet(p, clientv3.WithRange(prefixEnd(p)))
}

// capacityFence holds only if no capacity entry of the node lifecycle was
// written after rev. Deletes only lower usage, so an admission decided on
// the usage at rev stays exact.
func (s *Store) capacityFence(node authority.NodeDescriptor, lifecycle int64, rev int64) clientv3.Cmp {
	p := s.keys.capacityNode(node, lifecycle)
	return clientv3.Compare(clientv3.ModRevision(p), "<", rev+1).WithRange(prefixEnd(p))
}

// fits asks the policy whether alloc fits next to usage (the seed's
// hasPendingCapacity).
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

// CapacityUsage returns the active and reserved counts of one counter of a
// node lifecycle.
func (s *Store) CapacityUsage(ctx context.Context, node authority.NodeDescriptor, lifecycleGeneration int64, objectKind authority.ObjectKind, stableType string) (authority.CapacityUsage, error) {
	if err := s.begin(ctx); err != nil {
		return authority.CapacityUsage{}, err
	}
	resp, err := s.read(ctx, s.capacityRangeOp(node, lifecycleGeneration))
	if err != nil {
		return authority.CapacityUsage{}, err
	}
	u, err := s.sumUsage(node, lifecycleGeneration, rangeKvs(resp, 0))
	if err != nil {
		return authority.CapacityUsage{}, err
	}
	c := authority.UsageCounter(node, lifecycleGeneration, objectKind, stableType)
	return authority.CapacityUsage{Active: u.active[c], Reserved: u.reserved[c]}, nil
}
