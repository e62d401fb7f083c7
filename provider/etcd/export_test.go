package etcd

import authority "github.com/zlink-systems/authority"

// QueuedWrites is how many writes of s wait for a Txn slot (batch.go).
func QueuedWrites(s *Store) int {
	s.batch.mu.Lock()
	defer s.batch.mu.Unlock()
	return len(s.batch.queue)
}

// ForgetRows empties the row cache of s, as if its rows had been evicted.
func ForgetRows(s *Store) { s.cache = newRowCache(4096) }

// QueuedReservations is how many reservations of s on node (at lifecycle)
// wait in its group commit queue, not yet taken by a batch (groupcommit.go).
func QueuedReservations(s *Store, node authority.NodeDescriptor, lifecycle int64) int {
	reserveGroups.mu.Lock()
	defer reserveGroups.mu.Unlock()
	q := reserveGroups.m[groupKey{s, s.keys.capacityNode(node, lifecycle)}]
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
