package txnkit

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	authority "github.com/zlink-systems/authority"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Write batching.
//
// At most BatcherConfig.Slots (the store's Config.MaxConcurrentTxns) batchable write Txns of a store are in
// flight at a time (a write that cannot join a batch, or a member sent alone
// after its batch failed, does not wait for a slot). A write that finds a
// free slot is sent alone, exactly as built (its own Else reads, its own
// context): one client, or a lightly loaded store, sees no difference. A
// write that finds every slot busy queues; when a slot frees, the queued
// writes are sent together as one Txn whose If is every member's compares
// and whose Then is every member's ops. Each member keeps its own exact
// outcome:
//
//   - the merged Txn succeeded: every member's compares held, each member's
//     ops applied at the Txn's revision, and each gets the Then responses of
//     its own ops;
//   - it failed (some member's compare did not hold): nothing was written;
//     its Else read every compared key, so the members whose compares held
//     are known and go back to the head of the queue, and each of the others
//     sends its own Txn alone, which decides its outcome from its own Else
//     reads as if it had never been batched;
//   - etcd refused it as a whole for a reason one member can cause (a lease
//     gone, a limit): nothing was written, and every member is sent alone;
//   - any other error (the outcome is unknown, or etcd was unreachable):
//     every member gets it, as it would alone.
//
// Members are independent by construction, so the merged Txn means the same
// as the members applied one after another in any order: a write joins a
// batch only if it writes no key another member writes or compares and
// compares no key another member writes. The capacity epochs members touch
// (Txn.Touch) are put once: a blind put whose only meaning is "a capacity
// entry of this node changed at this revision", which every member's own
// put would say too. Writes fenced on a capacity epoch (a reservation or
// an aggregate prepare under a policy, which may not be merged with a
// member touching that epoch), with a range compare, or with a read among
// their ops are always sent alone.

// Batcher queues the write Txns of one store (see above). Make it with
// NewBatcher.
type Batcher struct {
	cfg BatcherConfig

	txns, batches, batched, fallbacks atomic.Int64

	mu     sync.Mutex
	busy   int // slots in use: Txns in flight, or a drainer between them
	queue  []*queuedTxn
	closed bool // the store is closed: nothing more is sent
}

// queuedTxn is one write waiting for a slot.
type queuedTxn struct {
	ctx context.Context
	t   *Txn
	// the write's keys (see keysOf)
	writes, compares []string

	done    chan struct{} // closed once the outcome below is set
	taken   bool          // under Batcher.mu: in a batch being sent
	retries int           // merged Txns it was in that failed on another's compare
	alone   bool          // the batch did not apply: send t alone
	resp    *clientv3.TxnResponse
	err     error
}

// BatcherConfig is what a Batcher needs of its store.
type BatcherConfig struct {
	// Slots is how many batchable writes are in flight at a time; 0:
	// batching off, every write is sent at once.
	Slots int
	// Limits bound a merged Txn.
	Limits Limits
	// Send sends one Txn (a write alone, or a merged batch).
	Send func(ctx context.Context, t *Txn) (*clientv3.TxnResponse, error)
	// Abandoned is the error of a write whose caller gave up after its
	// batch took it: its outcome is unknown.
	Abandoned func(cause error) error
	// Batched is told the size of each merged Txn sent (a metrics hook; nil:
	// none).
	Batched func(writes int)
}

// NewBatcher returns a Batcher that sends through cfg.Send.
func NewBatcher(cfg BatcherConfig) *Batcher {
	return &Batcher{cfg: cfg}
}

// Stats counts a Batcher's write Txns.
type Stats struct {
	// Txns is every write Txn sent (alone or merged).
	Txns int64
	// Batches is the merged Txns sent, and BatchedWrites the writes they
	// carried.
	Batches, BatchedWrites int64
	// Fallbacks is the merged Txns that did not apply (a compare failed or
	// etcd refused them), whose writes were then sent alone.
	Fallbacks int64
}

// Stats returns the Batcher's counts since NewBatcher.
func (b *Batcher) Stats() Stats {
	return Stats{Txns: b.txns.Load(), Batches: b.batches.Load(), BatchedWrites: b.batched.Load(), Fallbacks: b.fallbacks.Load()}
}

// Queued is how many writes wait for a slot.
func (b *Batcher) Queued() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue)
}

// keysOf returns the keys t writes and compares, or ok false when t cannot
// join a batch (a range compare or write, or a read among its ops).
func keysOf(t *Txn) (writes, compares []string, ok bool) {
	if t.Alone {
		return nil, nil, false
	}
	for _, c := range t.Cmps {
		if len(c.GetCompare().RangeEnd) > 0 {
			return nil, nil, false
		}
		compares = append(compares, string(c.KeyBytes()))
	}
	for _, op := range t.Then {
		if !(op.IsPut() || op.IsDelete()) || len(op.RangeBytes()) > 0 {
			return nil, nil, false
		}
		writes = append(writes, string(op.KeyBytes()))
	}
	return writes, compares, true
}

// send sends t as one Txn, counted.
func (b *Batcher) send(ctx context.Context, t *Txn) (*clientv3.TxnResponse, error) {
	b.txns.Add(1)
	return b.cfg.Send(ctx, t)
}

// Commit sends t, alone or in a batch, and returns its own outcome; the
// caller checks Succeeded.
func (b *Batcher) Commit(ctx context.Context, t *Txn) (*clientv3.TxnResponse, error) {
	if b.cfg.Slots <= 0 {
		return b.send(ctx, t)
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil, authority.ErrClosed
	}
	if b.busy < b.cfg.Slots {
		b.busy++
		b.mu.Unlock()
		resp, err := b.send(ctx, t)
		b.release()
		return resp, err
	}
	writes, compares, ok := keysOf(t)
	if !ok || len(t.Then) == 0 {
		b.mu.Unlock()
		return b.send(ctx, t)
	}
	q := &queuedTxn{ctx: ctx, t: t, writes: writes, compares: compares, done: make(chan struct{})}
	b.queue = append(b.queue, q)
	b.mu.Unlock()
	select {
	case <-q.done:
	case <-ctx.Done():
		b.mu.Lock()
		taken := q.taken
		if !taken {
			b.remove(q)
		}
		b.mu.Unlock()
		if !taken {
			return nil, notSent(ctx.Err())
		}
		select {
		case <-q.done: // the outcome arrived meanwhile
		default: // its batch may apply it after all
			return nil, b.cfg.Abandoned(ctx.Err())
		}
	}
	if q.alone {
		if err := ctx.Err(); err != nil {
			return nil, notSent(err)
		}
		return b.send(ctx, t)
	}
	return q.resp, q.err
}

// size estimates the bytes q adds to a merged Txn: its own, and the Else
// read of each key it compares.
func (q *queuedTxn) size() int {
	n := q.t.Bytes
	for _, k := range q.compares {
		n += len(k) + OpOverhead
	}
	return n
}

// notSent is the outcome of a write whose caller gave up before it was
// sent: definitely not applied.
func notSent(cause error) error { return NotSent(cause, "a free Txn slot") }

// NotSent reports a write whose context ended while it waited for
// waitingFor, before it was sent: nothing was written, so it wraps
// ErrUnavailable (safe to retry) and the context's error.
func NotSent(cause error, waitingFor string) error {
	return authority.Wrap(authority.ErrUnavailable, "etcd write not sent: its context ended while it waited for "+waitingFor, cause)
}

// refusedWhole reports whether err is etcd refusing a merged Txn before
// applying anything, for a reason one member may cause alone (a lease it
// no longer knows, a size limit): each member is then sent alone.
func refusedWhole(err error) bool {
	return errors.Is(err, rpctypes.ErrLeaseNotFound) || errors.Is(err, authority.ErrLimitExceeded) ||
		errors.Is(err, rpctypes.ErrDuplicateKey)
}

// remove drops q from the queue (under mu).
func (b *Batcher) remove(q *queuedTxn) {
	for i, w := range b.queue {
		if w == q {
			b.queue = append(b.queue[:i], b.queue[i+1:]...)
			return
		}
	}
}

// release frees a slot, or hands it to a drainer when writes are queued.
func (b *Batcher) release() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.queue) == 0 {
		b.busy--
		return
	}
	go b.drain()
}

// drain sends the queued writes, a batch at a time, until none is left; it
// holds one slot meanwhile.
func (b *Batcher) drain() {
	for {
		b.mu.Lock()
		batch := b.take()
		if len(batch) == 0 {
			b.busy--
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
		b.run(batch)
	}
}

// Close fails the queued writes with ErrClosed (they were not sent) and
// lets no batch start after it.
func (b *Batcher) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	for _, q := range b.queue {
		q.taken = true
		q.err = authority.ErrClosed
		close(q.done)
	}
	b.queue = nil
}

// take removes from the queue, in arrival order, the writes that fit
// together in one Txn (under mu).
func (b *Batcher) take() []*queuedTxn {
	var (
		batch           []*queuedTxn
		cmps, ops, size int
		written         = map[string]bool{}
		compared        = map[string]bool{}
		rest            = b.queue[:0]
	)
	for _, q := range b.queue {
		fits := len(batch) == 0 || cmps+len(q.t.Cmps) <= b.cfg.Limits.MaxOps && ops+len(q.t.Then)+len(q.t.Touches) <= b.cfg.Limits.MaxOps &&
			size+q.size() <= b.cfg.Limits.MaxBytes && independent(q, written, compared)
		if !fits {
			rest = append(rest, q)
			continue
		}
		for _, k := range q.writes {
			written[k] = true
		}
		for _, k := range q.compares {
			compared[k] = true
		}
		cmps, ops, size = cmps+len(q.t.Cmps), ops+len(q.t.Then)+len(q.t.Touches), size+q.size()
		q.taken = true
		batch = append(batch, q)
	}
	clear(b.queue[len(rest):])
	b.queue = rest
	return batch
}

// independent reports whether q neither writes a key the batch writes or
// compares nor compares a key the batch writes.
func independent(q *queuedTxn, written, compared map[string]bool) bool {
	for _, k := range q.writes {
		if written[k] || compared[k] {
			return false
		}
	}
	for _, k := range q.compares {
		if written[k] {
			return false
		}
	}
	return true
}

// run sends one batch and hands each member its outcome.
func (b *Batcher) run(batch []*queuedTxn) {
	// Members whose caller gave up since they were taken are not sent.
	live := batch[:0]
	for _, q := range batch {
		if err := q.ctx.Err(); err != nil {
			q.err = notSent(err)
			close(q.done)
			continue
		}
		live = append(live, q)
	}
	if batch = live; len(batch) == 0 {
		return
	}
	// The Txn is for the members still waiting: it ends early only when all
	// of them gave up. It carries the values (gRPC metadata, tracing) of the
	// first member's context.
	callers := make([]context.Context, len(batch))
	for i, q := range batch {
		callers[i] = q.ctx
	}
	ctx, release := AllEnded(callers)
	defer release()
	if len(batch) == 1 {
		q := batch[0]
		q.resp, q.err = b.send(ctx, q.t)
		close(q.done)
		return
	}
	resp, err := b.send(ctx, mergeBatch(batch))
	b.batches.Add(1)
	b.batched.Add(int64(len(batch)))
	if b.cfg.Batched != nil {
		b.cfg.Batched(len(batch))
	}
	if retry := b.settle(batch, resp, err); len(retry) > 0 {
		b.requeue(retry)
	}
}

// mergeBatch builds the one Txn of a batch: every member's compares and
// writes. The Else reads every compared key (keys only): when the Txn fails,
// the members whose compares all held are known, at the same revision. A
// compare several members make (the liveness of their common owner) is sent
// once: etcd evaluates each compare with a read.
func mergeBatch(batch []*queuedTxn) *Txn {
	merged := &Txn{}
	compared := map[string]bool{} // keys the Else reads
	sameCmp := map[string]bool{}
	for _, q := range batch {
		for i := range q.t.Cmps {
			if id := cmpID(&q.t.Cmps[i]); !sameCmp[id] {
				sameCmp[id] = true
				merged.Cmps = append(merged.Cmps, q.t.Cmps[i])
			}
		}
		merged.Then = append(merged.Then, q.t.Then...)
		for _, k := range q.t.Touches {
			merged.Touch(k) // touching an epoch twice is touching it once
		}
		for _, k := range q.compares {
			if !compared[k] {
				compared[k] = true
				merged.Els = append(merged.Els, clientv3.OpGet(k, clientv3.WithKeysOnly()))
			}
		}
	}
	return merged
}

// settle gives each member of a sent batch its outcome and returns the
// members to send batched again.
func (b *Batcher) settle(batch []*queuedTxn, resp *clientv3.TxnResponse, err error) []*queuedTxn {
	refused := err != nil && refusedWhole(err)
	var failed Reads
	if refused || err == nil && !resp.Succeeded {
		b.fallbacks.Add(1)
	}
	if err == nil && !resp.Succeeded {
		failed = ReadsOf(resp)
	}
	var retry []*queuedTxn
	off := 0 // where the next member's write responses start
	for _, q := range batch {
		switch {
		case refused:
			q.alone = true
		case err != nil:
			// unknown (it may have applied) or definitely not applied
			// (etcd unavailable before the send): as for a lone Txn
			q.err = err
		case !resp.Succeeded:
			// Members whose compares held go on batched; the others are
			// sent alone and decide from their own Else reads.
			if q.retries < maxBatchRetries && holds(q, failed) {
				q.retries++
				retry = append(retry, q)
				continue
			}
			q.alone = true
		default:
			n := len(q.t.Then)
			q.resp = thenPart(resp, off, n)
			off += n
		}
		close(q.done)
	}
	return retry
}

// maxBatchRetries bounds how often one write goes back to the queue after a
// merged Txn failed on another member's compare.
const maxBatchRetries = 3

// requeue puts writes whose compares held in a failed merged Txn back at the
// head of the queue, except those whose caller gave up meanwhile: those end
// here, so that nothing is sent after its caller returned.
func (b *Batcher) requeue(retry []*queuedTxn) {
	b.mu.Lock()
	defer b.mu.Unlock()
	head := make([]*queuedTxn, 0, len(retry)+len(b.queue))
	for _, q := range retry {
		if b.closed {
			q.err = authority.ErrClosed
			close(q.done)
			continue
		}
		if err := q.ctx.Err(); err != nil {
			q.err = notSent(err)
			close(q.done)
			continue
		}
		q.taken = false
		head = append(head, q)
	}
	b.queue = append(head, b.queue...)
}

// holds reports whether every compare of q holds on the keys a failed
// merged Txn read in its Else (keys only: a compare on a value or a lease is
// not decided here, and q then decides alone).
func holds(q *queuedTxn, got Reads) bool {
	for i := range q.t.Cmps {
		c := q.t.Cmps[i].GetCompare()
		switch c.Target {
		case pb.Compare_MOD, pb.Compare_CREATE, pb.Compare_VERSION:
		default:
			return false
		}
		var kvs []*mvccpb.KeyValue
		if kv := got[string(c.Key)]; kv != nil {
			kvs = append(kvs, kv)
		}
		if !Holds(c, kvs) {
			return false
		}
	}
	return true
}
