package etcd

// QueuedWrites is how many writes of s wait for a Txn slot (batch.go).
func QueuedWrites(s *Store) int {
	s.batch.mu.Lock()
	defer s.batch.mu.Unlock()
	return len(s.batch.queue)
}
