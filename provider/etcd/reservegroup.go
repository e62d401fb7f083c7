package etcd

import (
	"context"
	"errors"
	"slices"
	"sync"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/internal/etcdpage"
	"github.com/zlink-systems/authority/internal/observe"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Group commit of reservations under a capacity policy.
//
// Every reservation on a node lifecycle fences on the node's capacity epoch
// (every capacity change of the node moves it), so concurrent reservations
// on one node conflict with each other and would retry (and give up) in
// turn. Instead they queue per (store, node lifecycle): the first waiter
// becomes the leader, takes what queued up meanwhile (at most
// reserveBatchMax), reads the rows, the owners' liveness and the node's
// capacity epoch once (and its capacity range, the first time: then its
// usage is watched, usagewatch.go), admits the requests in arrival order
// with the policy, and writes every admitted reservation in one Txn fenced
// on the epoch. Then it hands leadership to the next waiter. The batch
// behaves as the requests applied one after another at the Txn's revision:
//
//   - a request whose row exists or whose owner is not live is refused from
//     the snapshot, as a single reserve would be;
//   - a request that does not fit next to the node's usage plus the requests
//     admitted before it is placementCapacityExhausted — but only once the
//     Txn holding those admitted requests committed (or when none was
//     admitted), since the answer depends on them;
//   - a request for a key admitted earlier in the batch, or one that no
//     longer fits the Txn limits, waits for the next round.
//
// When the Txn fails (a row appeared, an owner went away, another write on
// the node) its Else branch returns the same reads again at the current
// revision, and the round is decided again from them, without a new read: a
// conflicting request drops out and the others go on.

// reserveGroups holds a store's queue of every node lifecycle with a
// reservation in flight; an idle queue is removed, so nothing outlives its
// requests.
type reserveGroups struct {
	mu sync.Mutex
	m  map[string]*nodeQueue // by capacityNode prefix
}

// nodeQueue is the waiters of one node lifecycle, under s.groups.mu.
type nodeQueue struct {
	leading bool
	waiters []*reserveWaiter
}

type waiterState int

const (
	waiterQueued waiterState = iota // in nodeQueue.waiters
	waiterLeader                    // promoted: must run the next batch
	waiterTaken                     // in a batch being run
)

// reserveWaiter is one Reserve call waiting in a node's queue.
type reserveWaiter struct {
	ctx  context.Context
	req  authority.ReserveRequest
	res  *reservation
	wake chan struct{} // buffered: promoted, or the outcome is set

	// under s.groups.mu
	state waiterState
	done  bool
	out   authority.ReserveResult
	err   error
}

// reserveBatchMax is the most reservations of one batch: each writes 3 keys
// and reads (and compares) at most 2, plus the node's capacity epoch (put
// once, compared once) and its capacity range (read).
func (s *Store) reserveBatchMax() int { return max(1, (s.maxOps-1)/3) }

// reserveGrouped reserves res through the node's group commit queue.
func (s *Store) reserveGrouped(ctx context.Context, req authority.ReserveRequest, res *reservation) (authority.ReserveResult, error) {
	gk := s.keys.capacityNode(res.row.alloc.Descriptor, res.target.NodeLifecycleGeneration)
	w := &reserveWaiter{ctx: ctx, req: req, res: res, wake: make(chan struct{}, 1)}
	s.groups.mu.Lock()
	q := s.groups.m[gk]
	if q == nil {
		q = &nodeQueue{}
		s.groups.m[gk] = q
	}
	q.waiters = append(q.waiters, w)
	lead := !q.leading
	if lead {
		q.leading = true
		w.state = waiterLeader
	}
	s.groups.mu.Unlock()
	for !lead {
		select {
		case <-w.wake:
		case <-ctx.Done():
		}
		s.groups.mu.Lock()
		switch {
		case w.done:
			s.groups.mu.Unlock()
			return w.out, w.err
		case w.state == waiterLeader:
			s.groups.mu.Unlock()
			lead = true
		case ctx.Err() != nil && w.state == waiterQueued:
			q.remove(w)
			s.groups.mu.Unlock()
			return authority.ReserveResult{}, notSentWhile(ctx.Err(), "its node's reservation batch")
		case ctx.Err() != nil: // taken: the batch may still write it
			s.groups.mu.Unlock()
			return authority.ReserveResult{}, mapError(ctx.Err(), true)
		default:
			s.groups.mu.Unlock()
		}
	}
	s.leadBatch(gk, q)
	s.groups.mu.Lock()
	defer s.groups.mu.Unlock()
	return w.out, w.err
}

func (q *nodeQueue) remove(w *reserveWaiter) {
	for i, x := range q.waiters {
		if x == w {
			q.waiters = append(q.waiters[:i], q.waiters[i+1:]...)
			return
		}
	}
}

// leadBatch runs one batch from the front of q (the leader is first), sets
// the outcomes, then promotes the next waiter or retires the queue.
func (s *Store) leadBatch(gk string, q *nodeQueue) {
	s.groups.mu.Lock()
	n := min(len(q.waiters), s.reserveBatchMax())
	batch := make([]*reserveWaiter, n)
	copy(batch, q.waiters[:n])
	q.waiters = append(q.waiters[:0], q.waiters[n:]...)
	for _, w := range batch {
		w.state = waiterTaken
	}
	s.groups.mu.Unlock()

	outs := s.runBatch(batch)

	s.groups.mu.Lock()
	defer s.groups.mu.Unlock()
	for i, w := range batch {
		w.out, w.err, w.done = outs[i].out, outs[i].err, true
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
	if len(q.waiters) == 0 {
		q.leading = false
		delete(s.groups.m, gk)
		return
	}
	next := q.waiters[0]
	next.state = waiterLeader
	select {
	case next.wake <- struct{}{}:
	default:
	}
}

// batchOutcome is the result of one request of a batch.
type batchOutcome struct {
	out authority.ReserveResult
	err error
}

// batchContext is a context for a batch's requests (allEnded).
func batchContext(batch []*reserveWaiter) (context.Context, func()) {
	callers := make([]context.Context, len(batch))
	for i, w := range batch {
		callers[i] = w.ctx
	}
	return allEnded(callers)
}

// snapshotReads are the reads a batch's decision needs, in a read Txn (or a
// failed write Txn's Else): the
// row of each pending request and each distinct liveness key, found by key,
// then the node's usage reads (its capacity epoch, and its capacity range
// unless its usage is watched: usagewatch.go).
type snapshotReads struct {
	ops   []clientv3.Op
	usage usageRead
	bytes int // the request bytes of ops
}

func (s *Store) snapshotReadsFor(pending []int, batch []*reserveWaiter, fullRange bool) snapshotReads {
	var l snapshotReads
	seen := map[string]bool{}
	read := func(key string) {
		if !seen[key] {
			seen[key] = true
			l.ops = append(l.ops, opGet(key))
		}
	}
	for _, i := range pending {
		read(s.keys.row(batch[i].res.key))
	}
	for _, i := range pending {
		r := batch[i].res
		read(s.keys.liveness(r.target.Descriptor(), r.target.NodeLifecycleGeneration, r.target.Owner))
	}
	r := batch[pending[0]].res
	l.ops, l.usage = s.addUsageReads(l.ops, r.row.alloc.Descriptor, r.target.NodeLifecycleGeneration, fullRange)
	for _, op := range l.ops {
		l.bytes += len(op.KeyBytes()) + len(op.RangeBytes()) + opOverhead
	}
	return l
}

// decision of one request in one round.
type decision int

const (
	decideRefused   decision = iota + 1 // final from the snapshot
	decideExhausted                     // final once the round's Txn committed
	decideAdmitted                      // in the round's Txn
	decideDeferred                      // to the next round
)

// runBatch reserves the batch's requests (all on one node lifecycle) and
// returns their outcomes, in order.
func (s *Store) runBatch(batch []*reserveWaiter) []batchOutcome {
	outs := make([]batchOutcome, len(batch))
	s.obs.Metrics().GroupCommit(len(batch))
	ctx, release := batchContext(batch)
	defer release()
	node := batch[0].res.row.alloc.Descriptor
	lifecycle := batch[0].res.target.NodeLifecycleGeneration
	fail := func(idx []int, err error) {
		for _, i := range idx {
			outs[i].err = err
		}
	}
	pending := make([]int, 0, len(batch))
	for i := range batch {
		pending = append(pending, i)
	}
	var snap *clientv3.TxnResponse // the reads of layout at snap.Header.Revision
	var layout snapshotReads
	conflicts, rereads := 0, 0
	fullRange := false // read the node's capacity range, watched or not
	prefix := s.keys.capacityNode(node, lifecycle)
	// solo is a request that fits a Txn alone but not with the reads of the
	// whole batch: the next round decides it alone, the others are held
	// until it is decided.
	solo := -1
	var held []int
	defer func() {
		// a batch that stopped on an error sent none of the held requests
		for _, i := range held {
			if outs[i].err == nil && outs[i].out.Kind == "" {
				outs[i].err = authority.Wrap(authority.ErrUnavailable, "etcd write not sent: its node's reservation batch stopped", errBatchStopped)
			}
		}
	}()
	for len(pending) > 0 || len(held) > 0 {
		if len(pending) == 0 {
			pending, held, snap = held, nil, nil
		}
		// drop the requests whose callers gave up
		live := pending[:0]
		for _, i := range pending {
			if err := batch[i].ctx.Err(); err != nil {
				outs[i].err = notSentWhile(err, "its node's reservation batch")
				continue
			}
			live = append(live, i)
		}
		if pending = live; len(pending) == 0 {
			if len(held) > 0 {
				continue
			}
			break
		}
		if snap == nil {
			if solo >= 0 && slices.Contains(pending, solo) {
				for _, i := range pending {
					if i != solo {
						held = append(held, i)
					}
				}
				pending = []int{solo}
			}
			solo = -1
			layout = s.snapshotReadsFor(pending, batch, fullRange)
			resp, err := s.read(ctx, layout.ops...)
			if err != nil && len(pending) > 1 && receiveTooLarge(err) {
				// the rows of the whole batch do not fit one response: decide
				// the first half first, holding the rest
				half := len(pending) / 2
				held = append(held, pending[half:]...)
				pending = pending[:half]
				continue
			}
			if err != nil {
				fail(pending, err)
				break
			}
			snap, fullRange = resp, false
		}
		policy := s.capacityPolicy()
		u, epoch, ok, err := s.usageAt(ctx, snap, layout.usage)
		if err != nil {
			fail(pending, err)
			break
		}
		if !ok {
			// the watched usage is not that of the snapshot: read again,
			// with the range after the first time
			if rereads++; rereads > 1 {
				fullRange = true
			}
			snap = nil
			continue
		}
		delta := map[authority.CapacityCounter]int64{}
		t := &txn{}
		admittedKeys := map[authority.Key]bool{}
		decisions := make([]decision, len(batch))
		var admitted []int
		got := readsOf(snap)
		for _, i := range pending {
			w := batch[i]
			cur, err := s.rowIn(got, w.res.key)
			if err != nil {
				outs[i].err, decisions[i] = err, decideRefused
				continue
			}
			if cur != nil || got[w.res.liveKey(s)] == nil {
				if admittedKeys[w.res.key] {
					decisions[i] = decideDeferred // sees the admitted row next round
					continue
				}
				outs[i].out, decisions[i] = s.reserveRefused(w.req, cur), decideRefused
				continue
			}
			if admittedKeys[w.res.key] {
				decisions[i] = decideDeferred
				continue
			}
			if !fits(policy, w.res.row.alloc, u) {
				decisions[i] = decideExhausted
				continue
			}
			one := &txn{}
			s.addReserve(one, w.res)
			if len(admitted) == 0 {
				if err := s.check(one, "the reservation"); err != nil {
					outs[i].err, decisions[i] = err, decideRefused
					continue
				}
			}
			if !s.fitsWith(t, one, layout) {
				if len(admitted) == 0 && solo < 0 {
					// it would be first in any Txn: with its own reads alone it
					// fits or never will
					if own := s.snapshotReadsFor([]int{i}, batch, false); !s.fitsWith(t, one, own) {
						outs[i].err, decisions[i] = s.tooLargeWithReads(one, own), decideRefused
						continue
					}
					if len(pending) > 1 {
						solo = i
					}
				}
				decisions[i] = decideDeferred
				continue
			}
			merge(t, one)
			admittedKeys[w.res.key] = true
			admitted = append(admitted, i)
			decisions[i] = decideAdmitted
			for _, e := range authority.CapacityEntries(node, lifecycle, w.res.row.alloc.Capacity) {
				u.reserved[e.Counter] += e.Count
				delta[e.Counter] += e.Count
			}
		}
		next := pending[:0:0]
		if len(admitted) == 0 {
			// nothing to write: the snapshot alone decides the exhausted ones
			for _, i := range pending {
				switch decisions[i] {
				case decideExhausted:
					outs[i].out = authority.ReserveResult{Kind: authority.KindPlacementCapacityExhausted}
				case decideDeferred:
					next = append(next, i)
				}
			}
			pending, snap = next, nil
			continue
		}
		s.fenceCapacity(t, node, lifecycle, epoch)
		var waiting []int // pending requests whose outcome this Txn decides
		for _, i := range pending {
			if decisions[i] != decideRefused {
				waiting = append(waiting, i)
			}
		}
		elseLayout := s.snapshotReadsFor(waiting, batch, false)
		elseLayout.usage.capacity.at += len(t.els) // after t's own Else reads
		t.els = append(t.els, elseLayout.ops...)
		t.bytes += elseLayout.bytes
		resp, err := s.sendWrite(ctx, t, "the reservations")
		if err != nil {
			for _, i := range waiting {
				if decisions[i] != decideAdmitted {
					// deferred or exhausted: nothing of it was in the Txn, so
					// nothing of it applied, whatever the Txn's outcome
					outs[i].err = authority.Wrap(authority.ErrUnavailable, "etcd write not sent: its node's reservation batch failed ("+err.Error()+")", errBatchStopped)
				} else {
					outs[i].err = err
				}
			}
			break
		}
		if !resp.Succeeded {
			conflicts++
			s.retrying(observe.OpReserve, conflicts)
			if conflicts >= maxAttempts {
				fail(waiting, authority.Wrap(authority.ErrUnavailable, "reserve gave up after repeated capacity contention", errContention))
				break
			}
			pending, snap, layout = waiting, resp, elseLayout
			continue
		}
		s.usage.applied(prefix, epoch, resp.Header.Revision, delta)
		for _, i := range waiting {
			switch decisions[i] {
			case decideAdmitted:
				created := batch[i].res.row.next(resp.Header.Revision)
				created.createRev, created.ownerGen = resp.Header.Revision, resp.Header.Revision
				s.remember(created)
				outs[i].out = authority.ReserveResult{
					Kind:          authority.KindReserved,
					ReservationID: created.pending.ReservationID,
					Creating:      created.snapshot(s.clock.Now()),
				}
			case decideExhausted:
				outs[i].out = authority.ReserveResult{Kind: authority.KindPlacementCapacityExhausted}
			case decideDeferred:
				next = append(next, i)
			}
		}
		pending, snap = next, nil
	}
	return outs
}

// tooLargeWithReads is the error of a reservation that fits the Txn limits
// alone but not with the capacity fence and its own snapshot reads, which
// every Txn that admits it carries.
func (s *Store) tooLargeWithReads(one *txn, own snapshotReads) error {
	probe := &txn{}
	merge(probe, one)
	probe.cmps = append(probe.cmps, clientv3.Compare(clientv3.ModRevision(""), "<", 0)) // the fence
	probe.els = own.ops
	probe.bytes += own.bytes + 2*opOverhead
	if err := s.check(probe, "the reservation with its capacity fence and reads"); err != nil {
		return err
	}
	return limitError(flagMaxRequestBytes, "the reservation with its capacity fence and reads does not fit one transaction; it", nil)
}

// receiveTooLarge reports whether err is the client refusing a response over
// its receive limit (nothing was written).
func receiveTooLarge(err error) bool {
	return errors.Is(err, authority.ErrLimitExceeded) && etcdpage.TooLarge(err)
}

// errBatchStopped is the cause given to the requests a reservation batch
// held back when it stopped on an error.
var errBatchStopped = errors.New("reservation batch stopped before this request was sent")

// fitsWith reports whether t plus one, the capacity fence and the Else reads
// (at most those of l) stay within the Txn limits.
func (s *Store) fitsWith(t, one *txn, l snapshotReads) bool {
	cmps := len(t.cmps) + len(one.cmps) + 1
	then := len(t.then) + len(one.then) + len(t.touches)
	for _, k := range one.touches {
		if !slices.Contains(t.touches, k) {
			then++
		}
	}
	bytes := t.bytes + one.bytes + l.bytes + 2*opOverhead
	return max(cmps, then, len(l.ops)) <= s.maxOps && bytes <= s.maxBytes
}

// merge appends one's conditions and writes to t (distinct keys).
func merge(t, one *txn) {
	t.cmps = append(t.cmps, one.cmps...)
	for _, op := range one.then {
		t.mark(string(op.KeyBytes()))
	}
	t.then = append(t.then, one.then...)
	t.bytes += one.bytes
	for _, k := range one.touches {
		t.touch(k)
		t.bytes -= len(k) + opOverhead // counted in one.bytes
	}
	t.alone = t.alone || one.alone
}
