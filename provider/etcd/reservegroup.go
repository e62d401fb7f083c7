package etcd

import (
	"context"
	"errors"
	"slices"
	"sync"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/internal/etcdpage"
	"github.com/zlink-systems/authority/internal/observe"
	"github.com/zlink-systems/authority/provider/etcd/internal/txnkit"
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
	gk := s.keys.CapacityNode(res.row.Alloc.Descriptor, res.target.NodeLifecycleGeneration)
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
			return authority.ReserveResult{}, txnkit.NotSent(ctx.Err(), "its node's reservation batch")
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

// batchContext is a context for a batch's requests (txnkit.AllEnded).
func batchContext(batch []*reserveWaiter) (context.Context, func()) {
	callers := make([]context.Context, len(batch))
	for i, w := range batch {
		callers[i] = w.ctx
	}
	return txnkit.AllEnded(callers)
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
		read(s.keys.Row(batch[i].res.key))
	}
	for _, i := range pending {
		read(batch[i].res.liveKey(s))
	}
	r := batch[pending[0]].res
	l.ops, l.usage = s.addUsageReads(l.ops, r.row.Alloc.Descriptor, r.target.NodeLifecycleGeneration, fullRange)
	for _, op := range l.ops {
		l.bytes += len(op.KeyBytes()) + len(op.RangeBytes()) + txnkit.OpOverhead
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
	decideShort                         // escrow mode: short of the budget slice (escrow.go)
)

// runBatch reserves the batch's requests (all on one node lifecycle) and
// returns their outcomes, in order. Each round reads a snapshot (or decides
// from a failed Txn's Else reads), decides every pending request on it, and
// sends the admitted ones in one Txn fenced on the node's capacity epoch.
func (s *Store) runBatch(batch []*reserveWaiter) []batchOutcome {
	s.obs.Metrics().GroupCommit(len(batch))
	ctx, release := batchContext(batch)
	defer release()
	g := &groupRun{s: s, ctx: ctx, batch: batch, outs: make([]batchOutcome, len(batch)), solo: -1,
		node: batch[0].res.row.Alloc.Descriptor, lifecycle: batch[0].res.target.NodeLifecycleGeneration}
	for i := range batch {
		g.pending = append(g.pending, i)
	}
	defer g.stopHeld()
	for g.next() {
		if g.snap == nil && !g.readSnapshot() {
			continue
		}
		u, epoch, ok, err := s.usageAt(ctx, g.snap, g.reads.usage)
		if err != nil {
			g.fail(g.pending, err)
			return g.outs
		}
		if !ok {
			// the watched usage is not that of the snapshot: read again,
			// with the range after the first time
			g.rereads++
			g.fullRange, g.snap = g.rereads > 1, nil
			continue
		}
		sl, err := s.sliceAt(g.snap, g.reads.usage)
		if err != nil {
			g.fail(g.pending, err)
			return g.outs
		}
		r := g.decide(u, sl)
		if len(r.admitted) == 0 {
			if !g.growShort(r) {
				g.settleUnwritten(r)
			}
			continue
		}
		if !g.send(r, epoch, sl) {
			return g.outs
		}
	}
	return g.outs
}

// groupRun is one run of a node lifecycle's reservation batch: the
// requests, their outcomes, and what carries from one round to the next.
type groupRun struct {
	s             *Store
	ctx           context.Context
	batch         []*reserveWaiter
	outs          []batchOutcome
	node          authority.NodeDescriptor
	lifecycle     int64
	pending, held []int
	snap          *clientv3.TxnResponse // the reads at snap.Header.Revision
	reads         snapshotReads
	conflicts     int
	rereads       int
	grows         int  // escrow mode: budget grows asked for (escrow.go)
	fullRange     bool // read the node's capacity range, watched or not
	stopped       bool
	// solo is a request that fits a Txn alone but not with the reads of the
	// whole batch: the next round decides it alone, the others are held
	// until it is decided.
	solo int
}

// groupRound is one round's decisions.
type groupRound struct {
	t         *txnkit.Txn
	decisions []decision
	admitted  []int
	delta     map[authority.CapacityCounter]int64
}

func (g *groupRun) fail(idx []int, err error) {
	for _, i := range idx {
		g.outs[i].err = err
	}
	g.stopped = true
}

// stopHeld fails the held requests of a batch that stopped on an error:
// none of them was sent.
func (g *groupRun) stopHeld() {
	for _, i := range g.held {
		if g.outs[i].err == nil && g.outs[i].out.Kind == "" {
			g.outs[i].err = authority.Wrap(authority.ErrUnavailable, "etcd write not sent: its node's reservation batch stopped", errBatchStopped)
		}
	}
}

// next starts a round: it takes the held requests when none is pending and
// drops the requests whose callers gave up; false when nothing is left.
func (g *groupRun) next() bool {
	for !g.stopped && (len(g.pending) > 0 || len(g.held) > 0) {
		if len(g.pending) == 0 {
			g.pending, g.held, g.snap = g.held, nil, nil
		}
		live := g.pending[:0]
		for _, i := range g.pending {
			if err := g.batch[i].ctx.Err(); err != nil {
				g.outs[i].err = txnkit.NotSent(err, "its node's reservation batch")
				continue
			}
			live = append(live, i)
		}
		if g.pending = live; len(g.pending) > 0 {
			return true
		}
	}
	return false
}

// readSnapshot reads the pending requests' rows, liveness and the node's
// usage at one revision (a solo request alone, the others held); false when
// the round must start again (the reads were split, or failed).
func (g *groupRun) readSnapshot() bool {
	if g.solo >= 0 && slices.Contains(g.pending, g.solo) {
		for _, i := range g.pending {
			if i != g.solo {
				g.held = append(g.held, i)
			}
		}
		g.pending = []int{g.solo}
	}
	g.solo = -1
	g.reads = g.s.snapshotReadsFor(g.pending, g.batch, g.fullRange)
	resp, err := g.s.read(g.ctx, g.reads.ops...)
	if err != nil && len(g.pending) > 1 && receiveTooLarge(err) {
		// the rows of the whole batch do not fit one response: decide the
		// first half first, holding the rest
		half := len(g.pending) / 2
		g.held = append(g.held, g.pending[half:]...)
		g.pending = g.pending[:half]
		return false
	}
	if err != nil {
		g.fail(g.pending, err)
		return false
	}
	g.snap, g.fullRange = resp, false
	return true
}

// decide decides every pending request on the snapshot, usage u and (in
// escrow mode) budget slice sl, and builds the Txn of the admitted ones.
func (g *groupRun) decide(u nodeUsage, sl sliceFence) groupRound {
	s, policy := g.s, g.s.capacityPolicy()
	r := groupRound{t: &txnkit.Txn{}, decisions: make([]decision, len(g.batch)), delta: map[authority.CapacityCounter]int64{}}
	admittedKeys := map[authority.Key]bool{}
	got := txnkit.ReadsOf(g.snap)
	for _, i := range g.pending {
		w := g.batch[i]
		cur, err := s.rowIn(got, w.res.key)
		switch {
		case err != nil:
			g.outs[i].err, r.decisions[i] = err, decideRefused
		case admittedKeys[w.res.key]:
			r.decisions[i] = decideDeferred // sees the admitted row next round
		case cur != nil || got[w.res.liveKey(s)] == nil:
			g.outs[i].out, r.decisions[i] = s.reserveRefused(w.req, cur), decideRefused
		case !fits(policy, w.res.row.Alloc, u):
			r.decisions[i] = decideExhausted
		case !sl.holds(w.res.row.Alloc, u):
			r.decisions[i] = decideShort // decided again once the slice grew
		default:
			r.decisions[i] = g.admit(i, &r, admittedKeys)
			if r.decisions[i] == decideAdmitted {
				for _, e := range authority.CapacityEntries(g.node, g.lifecycle, w.res.row.Alloc.Capacity) {
					u.reserved[e.Counter] += e.Count
					r.delta[e.Counter] += e.Count
				}
			}
		}
	}
	return r
}

// admit adds request i to the round's Txn when it fits with the others and
// the reads; else it is deferred (or refused: it can never fit).
func (g *groupRun) admit(i int, r *groupRound, admittedKeys map[authority.Key]bool) decision {
	s, w := g.s, g.batch[i]
	one := &txnkit.Txn{}
	s.addReserve(one, w.res)
	if len(r.admitted) == 0 {
		if err := s.check(one, "the reservation"); err != nil {
			g.outs[i].err = err
			return decideRefused
		}
	}
	if !s.fitsWith(r.t, one, g.reads) {
		if len(r.admitted) == 0 && g.solo < 0 {
			// it would be first in any Txn: with its own reads alone it fits
			// or never will
			if own := s.snapshotReadsFor([]int{i}, g.batch, false); !s.fitsWith(r.t, one, own) {
				g.outs[i].err = s.tooLargeWithReads(one, own)
				return decideRefused
			}
			if len(g.pending) > 1 {
				g.solo = i
			}
		}
		return decideDeferred
	}
	r.t.MergeOnce(one) // one copy of the active-version fence every reservation carries
	admittedKeys[w.res.key] = true
	r.admitted = append(r.admitted, i)
	return decideAdmitted
}

// settleUnwritten ends a round that admitted nothing: the snapshot alone
// decides the exhausted requests; the deferred ones go to the next round.
func (g *groupRun) settleUnwritten(r groupRound) {
	next := g.pending[:0:0]
	for _, i := range g.pending {
		switch r.decisions[i] {
		case decideExhausted:
			g.outs[i].out = authority.ReserveResult{Kind: authority.KindPlacementCapacityExhausted}
		case decideDeferred, decideShort:
			next = append(next, i)
		}
	}
	g.pending, g.snap = next, nil
}

// send sends the round's Txn, fenced on the node's capacity epoch (and its
// budget slice sl), with the waiting requests' reads in its Else, and
// settles the round; false when the batch stopped.
func (g *groupRun) send(r groupRound, epoch int64, sl sliceFence) bool {
	s, t := g.s, r.t
	s.fenceCapacity(t, g.node, g.lifecycle, epoch)
	sl.fence(t)
	var waiting []int // pending requests whose outcome this Txn decides
	for _, i := range g.pending {
		if r.decisions[i] != decideRefused {
			waiting = append(waiting, i)
		}
	}
	elseReads := s.snapshotReadsFor(waiting, g.batch, false)
	elseReads.usage.capacity = elseReads.usage.capacity.Shift(len(t.Els)) // after t's own Else reads
	t.Els = append(t.Els, elseReads.ops...)
	t.Bytes += elseReads.bytes
	for _, i := range waiting { // each request holds only under the map it was routed by
		s.addMapFence(g.batch[i].ctx, t)
	}
	resp, err := s.sendWrite(g.ctx, t, "the reservations")
	if err != nil {
		g.sendFailed(r, waiting, err)
		return false
	}
	if !resp.Succeeded {
		g.conflicts++
		s.retrying(observe.OpReserve, g.conflicts)
		if g.conflicts >= maxAttempts {
			g.fail(waiting, authority.Wrap(authority.ErrUnavailable, "reserve gave up after repeated capacity contention", errContention))
			return false
		}
		// decide again from the Else reads, at the Txn's revision
		g.pending, g.snap, g.reads = waiting, resp, elseReads
		return true
	}
	g.committed(r, waiting, epoch, resp.Header.Revision)
	return true
}

// sendFailed settles a round whose Txn failed with err.
func (g *groupRun) sendFailed(r groupRound, waiting []int, err error) {
	for _, i := range waiting {
		if r.decisions[i] != decideAdmitted {
			// deferred or exhausted: nothing of it was in the Txn, so nothing
			// of it applied, whatever the Txn's outcome
			g.outs[i].err = authority.Wrap(authority.ErrUnavailable, "etcd write not sent: its node's reservation batch failed ("+err.Error()+")", errBatchStopped)
		} else {
			g.outs[i].err = err
		}
	}
	g.stopped = true
}

// committed settles a round whose Txn committed at rev.
func (g *groupRun) committed(r groupRound, waiting []int, epoch, rev int64) {
	s := g.s
	s.usage.applied(s.keys.CapacityNode(g.node, g.lifecycle), epoch, rev, r.delta)
	next := g.pending[:0:0]
	for _, i := range waiting {
		switch r.decisions[i] {
		case decideAdmitted:
			created := g.batch[i].res.row.Next(0)
			created.Written(rev)
			created.CreateRev = rev
			s.remember(created)
			g.outs[i].out = authority.ReserveResult{
				Kind:          authority.KindReserved,
				ReservationID: created.Pending.ReservationID,
				Creating:      created.Snapshot(s.clock.Now()),
			}
		case decideExhausted:
			g.outs[i].out = authority.ReserveResult{Kind: authority.KindPlacementCapacityExhausted}
		case decideDeferred, decideShort:
			next = append(next, i)
		}
	}
	g.pending, g.snap = next, nil
}

// tooLargeWithReads is the error of a reservation that fits the Txn limits
// alone but not with the capacity fence and its own snapshot reads, which
// every Txn that admits it carries.
func (s *Store) tooLargeWithReads(one *txnkit.Txn, own snapshotReads) error {
	probe := &txnkit.Txn{}
	probe.Merge(one)
	probe.Cmps = append(probe.Cmps, clientv3.Compare(clientv3.ModRevision(""), "<", 0)) // the fence
	probe.Els = own.ops
	probe.Bytes += own.bytes + 2*txnkit.OpOverhead
	if err := s.check(probe, "the reservation with its capacity fence and reads"); err != nil {
		return err
	}
	return txnkit.LimitError(txnkit.FlagMaxRequestBytes, "the reservation with its capacity fence and reads does not fit one transaction; it", nil)
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
func (s *Store) fitsWith(t, one *txnkit.Txn, l snapshotReads) bool {
	cmps := len(t.Cmps) + len(one.Cmps) + s.fenceCmps()
	then := len(t.Then) + len(one.Then) + len(t.Touches)
	for _, k := range one.Touches {
		if !slices.Contains(t.Touches, k) {
			then++
		}
	}
	bytes := t.Bytes + one.Bytes + l.bytes + 2*txnkit.OpOverhead
	return max(cmps, then, len(l.ops)) <= s.maxOps && bytes <= s.maxBytes
}
