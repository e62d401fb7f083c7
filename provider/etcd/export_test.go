package etcd

// QueuedWrites is how many writes of s wait for a Txn slot (batch.go).
func QueuedWrites(s *Store) int {
	s.batch.mu.Lock()
	defer s.batch.mu.Unlock()
	return len(s.batch.queue)
}

// ForgetRows empties the row cache of s, as if its rows had been evicted.
func ForgetRows(s *Store) { s.cache = newRowCache(4096) }
