package memory

import (
	"container/heap"
	"time"

	authority "github.com/zlink-systems/authority"
)

// This store sweeps reservation terminals, creation terminals and aggregate
// records (docs/deviations.md M7): reservation terminals and
// committed or aborted aggregates Retention after they were written (in write
// order, so a FIFO queue holds them in deadline order), creation terminals at
// their ExpiresAt (a min-heap, since deadlines are the callers'). Prepared
// aggregates are never swept. Every write sweeps what is due, so the cost is
// amortized O(1) per write.

// sweepEntry is a record due for removal at deadline.
type sweepEntry[K comparable] struct {
	key      K
	deadline time.Time
}

// fifo is a queue over a slice that reuses its space.
type fifo[T any] struct {
	items []T
	head  int
}

func (q *fifo[T]) push(v T) { q.items = append(q.items, v) }

func (q *fifo[T]) len() int { return len(q.items) - q.head }

func (q *fifo[T]) front() *T { return &q.items[q.head] }

func (q *fifo[T]) pop() {
	var zero T
	q.items[q.head] = zero
	q.head++
	if q.head == len(q.items) {
		q.items, q.head = q.items[:0], 0
	} else if q.head >= 1024 && q.head*2 >= len(q.items) {
		n := copy(q.items, q.items[q.head:])
		clear(q.items[n:])
		q.items, q.head = q.items[:n], 0
	}
}

// terminalHeap orders creation terminals by expiry.
type terminalHeap []*authority.TerminalRecord

func (h terminalHeap) Len() int           { return len(h) }
func (h terminalHeap) Less(i, j int) bool { return h[i].ExpiresAt.Before(h[j].ExpiresAt) }
func (h terminalHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *terminalHeap) Push(x any)        { *h = append(*h, x.(*authority.TerminalRecord)) }
func (h *terminalHeap) Pop() any {
	old := *h
	n := len(old) - 1
	x := old[n]
	old[n] = nil
	*h = old[:n]
	return x
}

// sweep removes every record due at now. The caller holds s.mu.
func (s *Store) sweep(now time.Time) {
	at := now.Sub(s.epoch)
	for s.reservationSweep.len() > 0 {
		e := s.reservationSweep.front()
		if e.deadline > at {
			break
		}
		s.reservations.sweep(e.seq, e.deadline)
		s.reservationSweep.pop()
	}
	for s.aggregateSweep.len() > 0 {
		e := s.aggregateSweep.front()
		if e.deadline.After(now) {
			break
		}
		if a, ok := s.aggregates[e.key]; ok && a.state != aggregatePrepared && !a.deadline.After(now) {
			delete(s.aggregates, e.key)
		}
		s.aggregateSweep.pop()
	}
	for len(s.terminalSweep) > 0 && !s.terminalSweep[0].ExpiresAt.After(now) {
		rec := heap.Pop(&s.terminalSweep).(*authority.TerminalRecord)
		key := rec.Operation.Key()
		if s.operationTerminals[key] == rec {
			delete(s.operationTerminals, key)
		}
	}
	s.dropExpiredPins(now)
}

// reservationSweepEntry is a reservation terminal due for removal at
// deadline (an offset from the store's epoch). It holds no pointer, so that
// the collector does not scan the queue.
type reservationSweepEntry struct {
	seq      uint64
	deadline time.Duration
}

// setReservationTerminal records how reservation seq ended.
func (s *Store) setReservationTerminal(seq uint64, state reservationState, now time.Time) {
	deadline := now.Add(s.retention).Sub(s.epoch)
	s.reservations.end(seq, state, deadline)
	s.reservationSweep.push(reservationSweepEntry{seq: seq, deadline: deadline})
}

// setOperationTerminal records the creation terminal of an operation.
func (s *Store) setOperationTerminal(key string, rec *authority.TerminalRecord) {
	s.operationTerminals[key] = rec
	heap.Push(&s.terminalSweep, rec)
}

// finishAggregate moves a prepared aggregate to its terminal state.
func (s *Store) finishAggregate(fence authority.Fence, a *aggregateRecord, state aggregateState, now time.Time) {
	a.state = state
	a.deadline = now.Add(s.retention)
	s.aggregateSweep.push(sweepEntry[authority.Fence]{key: fence, deadline: a.deadline})
}
