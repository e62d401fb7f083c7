package etcd

import (
	"context"
	"errors"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/provider/etcd/internal/txnkit"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Watched capacity usage.
//
// A reservation (or an aggregate prepare) under a capacity policy decides on
// its node's usage: the sum of the node's capacity entries. Reading and
// summing every entry for each decision costs O(entries on the node). So the
// store sums them once, with the read that first needs them, and from then
// on keeps the sum current with a watch on the node's capacity range, from
// the revision after that read, with previous values (a delete or a rewrite
// takes out what it replaces).
//
// The sum is exact as of the last capacity change it applied (usageWatch.at).
// Every Txn that changes a capacity entry also puts the node's capacity
// epoch (txnkit.Txn.Touch), so a read of the epoch tells the revision of the node's
// last capacity change at that read: when it equals at, the watched sum is
// the usage at the read. When the watch is behind, the decision waits for it
// (briefly); when it is ahead or broken, the decision reads the range again.
// The write is fenced on the epoch, as with a read range.
//
// A watch nobody used for usageWatchIdle is closed; so is any watch that
// fails (compaction past it, a lost leader, a value it cannot decode) or
// lags a read's epoch by more than usageCatchUp: the next decision on that
// node reads the range again and starts a new one.

// usageWatchIdle is how long a node's usage stays watched after its last use
// (a variable for tests).
var usageWatchIdle = 5 * time.Minute

// usageCatchUp bounds how long a decision waits for a watch that is behind
// the epoch it read; then the watch is dropped and the decision reads the
// node's range instead. etcd sends a change to its watchers as it applies
// it, so a healthy watch is milliseconds behind at most.
const usageCatchUp = 500 * time.Millisecond

// usageWatches holds a store's watched node usages, by capacityNode prefix.
type usageWatches struct {
	s      *Store
	mu     sync.Mutex
	m      map[string]*usageWatch
	closed bool
	wg     sync.WaitGroup
	// started counts the watches started, running their followers alive.
	started, running atomic.Int64
	// rangeReads counts the decisions (and usage reads) that summed a
	// node's capacity range instead of its watch.
	rangeReads atomic.Int64
}

// usageWatch is the watched usage of one node lifecycle.
type usageWatch struct {
	cancel    context.CancelFunc
	node      authority.NodeDescriptor
	lifecycle int64

	// under usageWatches.mu
	usage nodeUsage
	// at is the revision of the last capacity change applied: the node's
	// capacity epoch's ModRevision when the usage was last exact.
	at      int64
	broken  bool
	changed chan struct{} // closed (and replaced) whenever at moves or broken is set
	used    time.Time
	idle    *time.Timer // drops the watch once unused for usageWatchIdle
	// progress is the revision of the last watch response (for the lag
	// metric).
	progress int64
}

func newUsageWatches(s *Store) *usageWatches {
	return &usageWatches{s: s, m: map[string]*usageWatch{}}
}

// usageRead names a node's usage reads in a read Txn (or a failed Txn's
// Else): its capacity epoch, by key, and its capacity range, by handle, when
// the usage is not watched (ranged false otherwise).
type usageRead struct {
	node      authority.NodeDescriptor
	lifecycle int64
	epochKey  string
	ranged    bool
	capacity  txnkit.RangeRead
	sliceKey  string // escrow mode: the node's budget slice ("" otherwise; escrow.go)
}

// addUsageReads appends to ops what a decision on node's usage needs to read:
// the node's capacity epoch, and its capacity range when the usage is not
// watched or fullRange is set.
func (s *Store) addUsageReads(ops []clientv3.Op, node authority.NodeDescriptor, lifecycle int64, fullRange bool) ([]clientv3.Op, usageRead) {
	ur := usageRead{node: node, lifecycle: lifecycle, epochKey: s.keys.CapacityEpoch(node, lifecycle)}
	ops = append(ops, clientv3.OpGet(ur.epochKey, clientv3.WithKeysOnly()))
	if fullRange || !s.usage.watched(s.keys.CapacityNode(node, lifecycle)) {
		ur.ranged = true
		ops, ur.capacity = txnkit.AddRead(ops, s.capacityRangeOp(node, lifecycle))
	}
	return s.addSliceRead(ops, &ur), ur
}

// epochOf returns the capacity epoch read at ur in resp: the revision of the
// node's last capacity change (0: none since the layout had epochs).
func epochOf(resp *clientv3.TxnResponse, ur usageRead) int64 {
	if kv := txnkit.KVNamed(resp, ur.epochKey); kv != nil {
		return kv.ModRevision
	}
	return 0
}

// usageAt returns the usage of ur's node at resp's revision (a copy the
// caller may change) and the epoch it is exact at. ok is false when the
// usage is not known at that revision (the watch moved past it or failed, or
// the revision was compacted before the range's later pages were read):
// the caller reads again with the range (addUsageReads with fullRange).
func (s *Store) usageAt(ctx context.Context, resp *clientv3.TxnResponse, ur usageRead) (u nodeUsage, epoch int64, ok bool, err error) {
	epoch = epochOf(resp, ur)
	prefix := s.keys.CapacityNode(ur.node, ur.lifecycle)
	if ur.ranged {
		s.usage.rangeReads.Add(1)
		kvs, err := s.capacityKvs(ctx, resp, ur.capacity, ur.node, ur.lifecycle)
		if errors.Is(err, rpctypes.ErrCompacted) {
			return nodeUsage{}, 0, false, nil // read again, at a newer revision
		}
		if err != nil {
			return nodeUsage{}, 0, false, err
		}
		if epoch == 0 && len(kvs) > 0 && s.readOnly {
			// a read-only store puts no epoch: the sum of the range is its
			// answer (a read, fenced on nothing), with no watch started
			u, err := s.sumUsage(ur.node, ur.lifecycle, kvs)
			return u, 0, err == nil, err
		}
		if epoch == 0 && len(kvs) > 0 {
			// entries without an epoch (written by a build before epochs):
			// put it, then read again. A decision on an absent epoch is
			// fenced on it staying absent, which must mean an empty range
			// (PruneCapacityEpochs deletes only the epochs of empty ones).
			return nodeUsage{}, 0, false, backfillFailure(s.backfillEpoch(ctx, ur.node, ur.lifecycle))
		}
		u, err := s.sumUsage(ur.node, ur.lifecycle, kvs)
		if err != nil {
			return nodeUsage{}, 0, false, err
		}
		s.usage.start(prefix, ur.node, ur.lifecycle, u, epoch, resp.Header.Revision)
		return u, epoch, true, nil
	}
	u, ok = s.usage.wait(ctx, prefix, epoch)
	return u, epoch, ok, nil
}

// backfillEpoch puts the capacity epoch of a node lifecycle that has none.
// The put means only "the node's capacity may have changed now": at worst
// it fails a concurrent decision's fence, which then decides again.
func (s *Store) backfillEpoch(ctx context.Context, node authority.NodeDescriptor, lifecycle int64) error {
	key := s.keys.CapacityEpoch(node, lifecycle)
	t := &txnkit.Txn{}
	t.Cmp(modRevIs(key, 0))
	t.Put(key, "")
	_, err := s.sendWrite(ctx, t, "the capacity epoch")
	return err
}

// backfillFailure is the caller's error when putting its node's missing
// epoch failed with err: the caller's own write was not sent, so an unknown
// outcome of the epoch's put (which is harmless either way) is not the
// caller's; it becomes ErrUnavailable. Other errors already say nothing was
// applied and pass through.
func backfillFailure(err error) error {
	if errors.Is(err, authority.ErrOutcomeUnknown) {
		return authority.Wrap(authority.ErrUnavailable, "etcd write not sent: putting its node's missing capacity epoch had an unknown outcome ("+err.Error()+")", nil)
	}
	return err
}

// watched reports whether the usage of the node with capacity prefix is
// watched (and not failed).
func (ws *usageWatches) watched(prefix string) bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	w := ws.m[prefix]
	return w != nil && !w.broken
}

// wait returns a copy of the watched usage at prefix once the watch applied
// the change at epoch: ok is false when it is not watched, it failed, it is
// already past epoch, or it did not reach it within usageCatchUp.
func (ws *usageWatches) wait(ctx context.Context, prefix string, epoch int64) (nodeUsage, bool) {
	timer := time.NewTimer(usageCatchUp)
	defer timer.Stop()
	for {
		ws.mu.Lock()
		w := ws.m[prefix]
		if w != nil && !w.broken && epoch == 0 && w.at > 0 {
			// the epoch was pruned (the range is empty) after the watch
			// applied a change: no later event will name epoch 0, so the
			// watch cannot serve again; a new one starts from the range
			ws.drop(prefix, w)
			ws.mu.Unlock()
			return nodeUsage{}, false
		}
		if w == nil || w.broken || w.at > epoch {
			ws.mu.Unlock()
			return nodeUsage{}, false
		}
		w.used = time.Now()
		if w.at == epoch {
			u := w.usage.clone()
			ws.mu.Unlock()
			return u, true
		}
		ch := w.changed
		ws.mu.Unlock()
		select {
		case <-ch:
		case <-timer.C:
			// stalled (its stream may be down): read the range instead
			ws.mu.Lock()
			ws.drop(prefix, w)
			ws.mu.Unlock()
			return nodeUsage{}, false
		case <-ctx.Done():
			return nodeUsage{}, false
		}
	}
}

// applied records that the Txn at rev, fenced on the node's epoch being
// epoch, added delta to the node's reserved usage. The fence held, so no
// other capacity change lies between epoch and rev: a watch still at epoch
// moves to rev without waiting for its own events (it skips them).
func (ws *usageWatches) applied(prefix string, epoch, rev int64, delta map[authority.CapacityCounter]int64) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	w := ws.m[prefix]
	if w == nil || w.broken || w.at != epoch {
		return
	}
	for c, n := range delta {
		w.usage.reserved[c] += n
	}
	w.advance(rev)
}

// start watches the usage of the node lifecycle at prefix, summed as u from
// a read at rev whose node epoch was epoch, unless it is watched already.
func (ws *usageWatches) start(prefix string, node authority.NodeDescriptor, lifecycle int64, u nodeUsage, epoch, rev int64) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.closed {
		return
	}
	if w := ws.m[prefix]; w != nil && !w.broken {
		return
	} else if w != nil {
		ws.s.obs.Metrics().UsageResync()
		ws.s.obs.Logger().Info("capacity usage watch restarted", "node", node.RID, "lifecycle", lifecycle)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &usageWatch{cancel: cancel, node: node, lifecycle: lifecycle, usage: u.clone(), at: epoch,
		changed: make(chan struct{}), used: time.Now(), progress: rev}
	w.idle = time.AfterFunc(usageWatchIdle, func() { ws.expire(prefix, w) })
	ws.m[prefix] = w
	ws.wg.Add(1)
	ws.started.Add(1)
	ws.running.Add(1)
	ws.s.obs.Metrics().UsageWatchStarted()
	go func() {
		defer ws.wg.Done()
		defer ws.running.Add(-1)
		defer ws.s.obs.Metrics().UsageWatchStopped()
		// Watch can block until the client has a stream (no lock held)
		wch := ws.s.client.Watch(clientv3.WithRequireLeader(ctx), prefix,
			clientv3.WithRange(prefixEnd(prefix)), clientv3.WithRev(rev+1), clientv3.WithPrevKV())
		ws.follow(prefix, w, wch)
	}()
}

// expire drops w unless it was used within usageWatchIdle.
func (ws *usageWatches) expire(prefix string, w *usageWatch) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.m[prefix] != w {
		return
	}
	if idle := time.Since(w.used); idle < usageWatchIdle {
		w.idle.Reset(usageWatchIdle - idle)
		return
	}
	ws.drop(prefix, w)
}

// drop ends w and forgets it (under mu).
func (ws *usageWatches) drop(prefix string, w *usageWatch) {
	w.cancel()
	if w.idle != nil {
		w.idle.Stop()
	}
	w.fail()
	if ws.m[prefix] == w {
		delete(ws.m, prefix)
	}
}

// follow applies the watch's events to w until it ends or fails.
func (ws *usageWatches) follow(prefix string, w *usageWatch, wch clientv3.WatchChan) {
	defer w.cancel()
	for wr := range wch {
		if wr.Err() != nil || wr.Canceled {
			ws.ended(w, wr)
			break
		}
		ws.mu.Lock()
		err := ws.apply(prefix, w, wr.Events)
		w.progress = wr.Header.Revision
		ws.measureLag()
		ws.mu.Unlock()
		if err != nil {
			break
		}
	}
	ws.mu.Lock()
	defer ws.mu.Unlock()
	ws.drop(prefix, w)
}

var errNoPrevKV = errors.New("capacity watch event without its previous value")

// apply adds the events of one watch response to w (under mu). On an error
// w is failed at once, before the lock is released: its usage may hold
// part of the response.
func (ws *usageWatches) apply(prefix string, w *usageWatch, events []*clientv3.Event) error {
	if w.broken {
		return errNoPrevKV
	}
	if err := ws.applyEvents(prefix, w, events); err != nil {
		w.fail()
		return err
	}
	return nil
}

func (ws *usageWatches) applyEvents(prefix string, w *usageWatch, events []*clientv3.Event) error {
	at := w.at
	for _, ev := range events {
		rev := ev.Kv.ModRevision
		if rev <= w.at {
			continue // applied already (applied)
		}
		if prev := ev.PrevKv; prev != nil {
			if err := w.add(prefix, prev, -1); err != nil {
				return err
			}
		} else if ev.Type == mvccpb.DELETE || ev.Kv.CreateRevision != ev.Kv.ModRevision {
			// a delete or a rewrite whose old value etcd could not give
			// (compacted): the sum can no longer be kept
			return errNoPrevKV
		}
		if ev.Type == mvccpb.PUT {
			if err := w.add(prefix, ev.Kv, 1); err != nil {
				return err
			}
		}
		at = max(at, rev)
	}
	if at != w.at {
		w.advance(at)
	}
	return nil
}

// add adds sign × the capacity entry kv holds to w's usage.
func (w *usageWatch) add(prefix string, kv *mvccpb.KeyValue, sign int64) error {
	st, c, err := schema.DecodeNodeCapacityEntry(prefix, kv)
	if err != nil {
		return err
	}
	into := w.usage.active
	if st == authority.AllocationReserved {
		into = w.usage.reserved
	}
	for _, e := range authority.CapacityEntries(w.node, w.lifecycle, c) {
		into[e.Counter] += sign * e.Count
	}
	return nil
}

// advance moves w to the change at rev and wakes its waiters (under mu).
func (w *usageWatch) advance(rev int64) {
	w.at = rev
	close(w.changed)
	w.changed = make(chan struct{})
}

// fail marks w failed and wakes its waiters (under mu).
func (w *usageWatch) fail() {
	if !w.broken {
		w.broken = true
		close(w.changed)
		w.changed = make(chan struct{})
	}
}

// close stops every watch and waits for them.
func (ws *usageWatches) close() {
	ws.mu.Lock()
	ws.closed = true
	for p, w := range ws.m {
		ws.drop(p, w)
	}
	ws.mu.Unlock()
	ws.wg.Wait()
}

func (u nodeUsage) clone() nodeUsage {
	return nodeUsage{reserved: maps.Clone(u.reserved), active: maps.Clone(u.active)}
}

// ended records why a usage watch ended (compacted, or an error).
func (ws *usageWatches) ended(w *usageWatch, wr clientv3.WatchResponse) {
	if wr.CompactRevision != 0 {
		ws.s.obs.Metrics().CompactionSeen()
		ws.s.obs.Logger().Info("capacity usage watch found its revision compacted; the next read re-reads the node",
			"node", w.node.RID, "compactRevision", wr.CompactRevision)
		return
	}
	ws.s.obs.Logger().Warn("capacity usage watch ended", "node", w.node.RID, "error", wr.Err())
}

// measureLag sets the usage-watch lag metric: how far the slowest watch is
// behind the newest revision the store has seen (under mu).
func (ws *usageWatches) measureLag() {
	m := ws.s.obs.Metrics()
	if m == nil {
		return
	}
	newest, lag := ws.s.guard.Floor(), int64(0)
	for _, w := range ws.m {
		lag = max(lag, newest-w.progress)
	}
	m.UsageLag(lag)
}
