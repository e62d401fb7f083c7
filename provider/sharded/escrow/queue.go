package escrow

import (
	"context"
	"sync"
)

// reclaimQueues serializes a mover's reclaims per node lifecycle and lets
// the callers that queued behind a reclaim share the next one.
//
// A reclaim serves a caller when it started after the caller arrived: every
// slack it gave back was released after the caller's own refusal, which is
// what the caller's reclaim would have done. So of N callers that find a
// reclaim running, the first runs the next one and the others take its
// result: two reclaims instead of N when many requests on one node are
// refused at once.
type reclaimQueues struct {
	mu sync.Mutex
	m  map[string]*reclaimQueue
}

// reclaimQueue is one node lifecycle's: a lock and the runs' numbers.
type reclaimQueue struct {
	lock    chan struct{} // holds one token: the reclaim running
	users   int           // callers waiting or running (under reclaimQueues.mu)
	started uint64        // runs started (under reclaimQueues.mu)
	lastOK  uint64        // the number of the last run that succeeded
}

// reclaimTurn is a caller's turn: it holds the lock until done.
type reclaimTurn struct {
	qs      *reclaimQueues
	key     string
	q       *reclaimQueue
	arrived uint64 // runs started when the caller arrived
	run     uint64 // this turn's run number (0: served by another)
}

// wait queues for key's lock (or gives up when ctx ends).
func (qs *reclaimQueues) wait(ctx context.Context, key string) (*reclaimTurn, error) {
	qs.mu.Lock()
	q := qs.m[key]
	if q == nil {
		q = &reclaimQueue{lock: make(chan struct{}, 1)}
		qs.m[key] = q
	}
	q.users++
	t := &reclaimTurn{qs: qs, key: key, q: q, arrived: q.started}
	qs.mu.Unlock()
	select {
	case q.lock <- struct{}{}:
		return t, nil
	case <-ctx.Done():
		qs.leave(t)
		return nil, ctx.Err()
	}
}

// served reports whether a run that started after the caller arrived has
// succeeded; then the turn ends here. Otherwise the caller runs the next
// reclaim and calls done.
func (t *reclaimTurn) served() bool {
	t.qs.mu.Lock()
	if t.q.lastOK > t.arrived {
		t.qs.mu.Unlock()
		<-t.q.lock
		t.qs.leave(t)
		return true
	}
	t.q.started++
	t.run = t.q.started
	t.qs.mu.Unlock()
	return false
}

// done ends the turn's run: ok says it succeeded.
func (t *reclaimTurn) done(ok bool) {
	t.qs.mu.Lock()
	if ok {
		t.q.lastOK = t.run
	}
	t.qs.mu.Unlock()
	<-t.q.lock
	t.qs.leave(t)
}

// leave drops the caller from its queue, and the queue once unused.
func (qs *reclaimQueues) leave(t *reclaimTurn) {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	if t.q.users--; t.q.users == 0 {
		delete(qs.m, t.key)
	}
}
