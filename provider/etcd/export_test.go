package etcd

import (
	"context"
	"sync"
	"time"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/provider/etcd/storeversion"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// QueuedWrites is how many writes of s wait for a Txn slot (txnkit.Batcher).
func QueuedWrites(s *Store) int { return s.batch.Queued() }

// ForgetRows empties the row cache of s, as if its rows had been evicted.
func ForgetRows(s *Store) { s.cache = newRowCache(4096) }

// QueuedReservations is how many reservations of s on node (at lifecycle)
// wait in its group commit queue, not yet taken by a batch (reservegroup.go).
func QueuedReservations(s *Store, node authority.NodeDescriptor, lifecycle int64) int {
	s.groups.mu.Lock()
	defer s.groups.mu.Unlock()
	q := s.groups.m[s.keys.CapacityNode(node, lifecycle)]
	if q == nil {
		return 0
	}
	n := 0
	for _, w := range q.waiters {
		if w.state == waiterQueued {
			n++
		}
	}
	return n
}

// WatchedUsage returns the usage of one counter of a node lifecycle as the
// watch of s sums it (usagewatch.go), once the watch applied the node's
// capacity changes up to now; ok is false when the node's usage is not
// watched or its watch could not catch up.
func WatchedUsage(ctx context.Context, s *Store, node authority.NodeDescriptor, lifecycle int64, kind authority.ObjectKind, stableType string) (authority.CapacityUsage, bool, error) {
	ops, ur := s.addUsageReads(nil, node, lifecycle, false)
	if ur.ranged {
		return authority.CapacityUsage{}, false, nil
	}
	resp, err := s.read(ctx, ops...)
	if err != nil {
		return authority.CapacityUsage{}, false, err
	}
	u, ok := s.usage.wait(ctx, s.keys.CapacityNode(node, lifecycle), epochOf(resp, ur))
	c := authority.UsageCounter(node, lifecycle, kind, stableType)
	return authority.CapacityUsage{Active: u.active[c], Reserved: u.reserved[c]}, ok, nil
}

// WatchedNodes is how many node usages s watches.
func WatchedNodes(s *Store) int {
	s.usage.mu.Lock()
	defer s.usage.mu.Unlock()
	return len(s.usage.m)
}

// CancelUsageWatches ends every usage watch of s as a failed watch ends
// (its follower drops it); the next decision on a node reads its range.
func CancelUsageWatches(s *Store) {
	s.usage.mu.Lock()
	defer s.usage.mu.Unlock()
	for _, w := range s.usage.m {
		w.cancel()
	}
}

// SetUsageWatchIdle sets how long an unused usage watch lives, until the
// test ends.
func SetUsageWatchIdle(t interface{ Cleanup(func()) }, d time.Duration) {
	old := usageWatchIdle
	usageWatchIdle = d
	t.Cleanup(func() { usageWatchIdle = old })
}

// UsageWatchCounts returns how many usage watches s started and how many of
// their followers still run.
func UsageWatchCounts(s *Store) (started, running int64) {
	return s.usage.started.Load(), s.usage.running.Load()
}

// CapacityRangeReads is how many times s summed a node's capacity range
// (a first decision or usage read on the node, or one its watch could not
// serve) instead of its usage watch.
func CapacityRangeReads(s *Store) int64 { return s.usage.rangeReads.Load() }

// SetCapacityPage sets how many capacity entries one range request reads,
// until the test ends.
func SetCapacityPage(t interface{ Cleanup(func()) }, n int64) {
	old := capacityPage
	capacityPage = n
	t.Cleanup(func() { capacityPage = old })
}

// LeaseIDOf returns the etcd lease behind an owner lease.
func LeaseIDOf(l *OwnerLease) clientv3.LeaseID { return l.lease }

// DrawBlobReferences makes PutNew draw refs, in order, before random ones,
// until the test ends.
func DrawBlobReferences(t interface{ Cleanup(func()) }, refs ...string) {
	old := newBlobReference
	var mu sync.Mutex
	newBlobReference = func() string {
		mu.Lock()
		defer mu.Unlock()
		if len(refs) == 0 {
			return old()
		}
		ref := refs[0]
		refs = refs[1:]
		return ref
	}
	t.Cleanup(func() { newBlobReference = old })
}

// SetOwnerIndexPage sets how many owner index entries RemoveAllByOwner and
// RebindRows read at once, until the test ends.
func SetOwnerIndexPage(t interface{ Cleanup(func()) }, n int) {
	old := ownerIndexPage
	ownerIndexPage = n
	t.Cleanup(func() { ownerIndexPage = old })
}

// FinalizeRacing is Finalize calling afterRead between each status read and
// the Txn that moves the version.
func FinalizeRacing(ctx context.Context, kv clientv3.KV, namespace string, target storeversion.Version, afterRead func()) (FinalizeResult, error) {
	return finalize(ctx, kv, namespace, target, false, afterRead)
}

// AnnounceTTLSeconds is the TTL of a store's own announcement lease.
const AnnounceTTLSeconds = int64(announceTTL / time.Second)

// SetCloseRevokeTimeout sets how long Close may wait for its revokes and
// returns the function that restores it.
func SetCloseRevokeTimeout(d time.Duration) (restore func()) {
	old := closeRevokeTimeout
	closeRevokeTimeout = d
	return func() { closeRevokeTimeout = old }
}
