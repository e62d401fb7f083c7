package etcd

import (
	"cmp"
	"context"
	"fmt"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/internal/etcdpage"
	"github.com/zlink-systems/authority/provider/etcd/internal/txnkit"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The capacity escrow's steps on one cluster: each reads and writes keys of
// this store's namespace only, in one Txn fenced on what it read, and is
// idempotent, so a mover that crashes between two steps (package
// provider/sharded/escrow) leaves nothing another mover cannot finish.
// docs/design-etcd.md "Capacity escrow across shards" has the protocol.

// Budget returns the capacity escrow's steps on this store's cluster.
func (s *Store) Budget() BudgetSteps { return BudgetSteps{s} }

// BudgetSteps are the fenced steps of the capacity escrow on one cluster:
// a node lifecycle's budget slice here (Slice, Receive, Release) and, when
// this cluster is the node's home shard, its ledger (Ledger, Grant, Credit,
// Ledgers).
type BudgetSteps struct{ s *Store }

// SliceState is a node lifecycle's budget slice in one cluster and the
// capacity its rows and aggregates hold there (reserved + active), read at
// one revision.
type SliceState struct {
	Slice    schema.BudgetSlice
	Usage    schema.Budget
	Revision int64
}

// NodeLifecycle names one lifecycle of a node.
type NodeLifecycle struct {
	Node      authority.NodeDescriptor
	Lifecycle int64
}

// checkNode refuses a node lifecycle no reservation could be on.
func checkNode(node authority.NodeDescriptor, lifecycle int64) error {
	if err := authority.RequireText(node.MeshName, "node mesh name"); err != nil {
		return err
	}
	if err := authority.RequireText(node.RID, "node RID"); err != nil {
		return err
	}
	if lifecycle < 0 {
		return authority.Invalid("node lifecycle generation must not be negative.")
	}
	return nil
}

// begin is the check every step makes first; write steps refuse on a
// read-only store.
func (b BudgetSteps) begin(ctx context.Context, node authority.NodeDescriptor, lifecycle int64, write bool) error {
	if err := checkNode(node, lifecycle); err != nil {
		return err
	}
	if write {
		if err := b.s.refuseWrite(); err != nil {
			return err
		}
	}
	return b.s.begin(ctx)
}

// Slice reads the node lifecycle's budget slice and usage here.
func (b BudgetSteps) Slice(ctx context.Context, node authority.NodeDescriptor, lifecycle int64) (SliceState, error) {
	if err := b.begin(ctx, node, lifecycle, false); err != nil {
		return SliceState{}, err
	}
	st, _, _, err := b.readSlice(ctx, node, lifecycle)
	return st, err
}

// readSlice reads the slice and the usage at one revision, with the
// capacity epoch and the slice's ModRevision a write on them fences on.
func (b BudgetSteps) readSlice(ctx context.Context, node authority.NodeDescriptor, lifecycle int64) (st SliceState, epoch, sliceRev int64, err error) {
	s := b.s
	fullRange := false
	for attempt := 1; attempt <= 4; attempt++ {
		ops, ur := s.addUsageReads(nil, node, lifecycle, fullRange)
		if ur.sliceKey == "" {
			ur.sliceKey = s.keys.BudgetSlice(node, lifecycle)
			ops = append(ops, opGet(ur.sliceKey))
		}
		resp, err := s.read(ctx, ops...)
		if err != nil {
			return SliceState{}, 0, 0, err
		}
		u, epoch, ok, err := s.usageAt(ctx, resp, ur)
		if err != nil {
			return SliceState{}, 0, 0, err
		}
		if !ok {
			fullRange = attempt >= 2
			continue
		}
		kv := txnkit.KVNamed(resp, ur.sliceKey)
		st = SliceState{Usage: schema.Budget{}, Revision: resp.Header.Revision}
		if kv != nil {
			if st.Slice, err = schema.DecodeBudgetSlice(kv); err != nil {
				return SliceState{}, 0, 0, err
			}
			sliceRev = kv.ModRevision
		}
		for _, m := range []map[authority.CapacityCounter]int64{u.reserved, u.active} {
			for c, n := range m {
				st.Usage[schema.BudgetCounterOf(c)] += n
			}
		}
		st.Usage = st.Usage.Positive()
		return st, epoch, sliceRev, nil
	}
	return SliceState{}, 0, 0, authority.Wrap(authority.ErrUnavailable,
		"budget slice: the node's capacity kept changing or was compacted between reads", errContention)
}

// Receive applies the ledger's figure given (what it ever gave this shard)
// to the slice: Received becomes the larger of the two, counter by
// counter. Applying a figure twice, or an older one after a newer one,
// changes nothing. It returns the slice as it stands after.
func (b BudgetSteps) Receive(ctx context.Context, node authority.NodeDescriptor, lifecycle int64, given schema.Budget) (schema.BudgetSlice, error) {
	if err := b.begin(ctx, node, lifecycle, true); err != nil {
		return schema.BudgetSlice{}, err
	}
	if err := given.CheckStored(); err != nil {
		return schema.BudgetSlice{}, authority.Wrap(authority.ErrInvalidArgument, "budget to receive", err)
	}
	key := b.s.keys.BudgetSlice(node, lifecycle)
	for attempt := 0; attempt < maxAttempts; attempt++ {
		cur, rev, err := readOne(ctx, b.s, key, decodeSlice)
		if err != nil {
			return schema.BudgetSlice{}, err
		}
		if cur.Received.Covers(given) {
			return cur, nil // applied already
		}
		next := schema.BudgetSlice{Received: cur.Received.Max(given), Returned: cur.Returned}
		if ok, err := b.put(ctx, key, rev, next.Encode(), nil, "the budget slice"); err != nil || ok {
			return next, err
		}
	}
	return schema.BudgetSlice{}, contended("receiving budget")
}

// Release gives the slice's slack back: Returned grows by what the slice
// holds beyond the usage, counter by counter, in a Txn fenced on the
// node's capacity epoch (so on the usage it read) and on the slice. The
// ledger learns it through Credit. It returns the slice after.
func (b BudgetSteps) Release(ctx context.Context, node authority.NodeDescriptor, lifecycle int64) (schema.BudgetSlice, error) {
	if err := b.begin(ctx, node, lifecycle, true); err != nil {
		return schema.BudgetSlice{}, err
	}
	s := b.s
	key, epochKey := s.keys.BudgetSlice(node, lifecycle), s.keys.CapacityEpoch(node, lifecycle)
	for attempt := 0; attempt < maxAttempts; attempt++ {
		st, epoch, rev, err := b.readSlice(ctx, node, lifecycle)
		if err != nil {
			return schema.BudgetSlice{}, err
		}
		slack := st.Slice.Size().Minus(st.Usage).Positive()
		if slack.IsZero() {
			return st.Slice, nil
		}
		next := schema.BudgetSlice{Received: st.Slice.Received, Returned: st.Slice.Returned.Plus(slack)}
		if ok, err := b.put(ctx, key, rev, next.Encode(), []clientv3.Cmp{modRevIs(epochKey, epoch)}, "the budget release"); err != nil || ok {
			return next, err
		}
	}
	return schema.BudgetSlice{}, contended("releasing budget")
}

// Ledger reads the node lifecycle's ledger (empty when it has none).
func (b BudgetSteps) Ledger(ctx context.Context, node authority.NodeDescriptor, lifecycle int64) (schema.BudgetLedger, error) {
	if err := b.begin(ctx, node, lifecycle, false); err != nil {
		return schema.BudgetLedger{}, err
	}
	l, _, err := readOne(ctx, b.s, b.s.keys.BudgetLedger(node, lifecycle), decodeLedger)
	return l, err
}

// Grant adds to shard's Given in the ledger the first of asks the capacity
// policy admits on top of everything the ledger granted (Granted, as
// reserved, nothing active), in a Txn fenced on the ledger; none admitted is
// an error wrapping ErrBudgetExhausted. It returns the ledger after. The
// shard's slice receives it with Receive.
func (b BudgetSteps) Grant(ctx context.Context, node authority.NodeDescriptor, lifecycle int64, shard int, asks ...authority.CapacityVector) (schema.BudgetLedger, error) {
	if err := b.begin(ctx, node, lifecycle, true); err != nil {
		return schema.BudgetLedger{}, err
	}
	if err := checkShard(shard); err != nil {
		return schema.BudgetLedger{}, err
	}
	for _, a := range asks {
		if err := authority.ValidateCapacityVector(a); err != nil {
			return schema.BudgetLedger{}, err
		}
	}
	key := b.s.keys.BudgetLedger(node, lifecycle)
	for attempt := 0; attempt < maxAttempts; attempt++ {
		cur, rev, err := readOne(ctx, b.s, key, decodeLedger)
		if err != nil {
			return schema.BudgetLedger{}, err
		}
		ask, ok := b.firstAdmitted(node, lifecycle, cur.Granted(), asks)
		if !ok {
			return cur, authority.Wrap(ErrBudgetExhausted, fmt.Sprintf("the capacity policy admits none of %d asks for node %s/%s@%d", len(asks), node.MeshName, node.RID, lifecycle), nil)
		}
		next := withLine(cur, shard)
		line := next.Shards[shard]
		line.Given = line.Given.Plus(schema.BudgetOf(ask))
		if err := line.Given.CheckStored(); err != nil {
			return schema.BudgetLedger{}, authority.Wrap(authority.ErrLimitExceeded, "the ledger's budget count", err)
		}
		next.Shards[shard] = line
		if ok, err := b.put(ctx, key, rev, next.Encode(), nil, "the budget grant"); err != nil || ok {
			return next, err
		}
	}
	return schema.BudgetLedger{}, contended("granting budget")
}

// firstAdmitted returns the first ask the capacity policy admits next to
// granted (all of it counted as reserved); with no policy, the first.
func (b BudgetSteps) firstAdmitted(node authority.NodeDescriptor, lifecycle int64, granted schema.Budget, asks []authority.CapacityVector) (authority.CapacityVector, bool) {
	policy := b.s.capacityPolicy()
	for _, ask := range asks {
		if policy == nil {
			return ask, true
		}
		counters := authority.UsageCounters(node, lifecycle, ask)
		reserved, active := make([]int64, len(counters)), make([]int64, len(counters))
		for i, c := range counters {
			reserved[i] = granted[schema.BudgetCounterOf(c)]
		}
		if policy.PlacementCapacityAvailable(node, ask.Clone(), authority.UsageVector(ask, reserved), authority.UsageVector(ask, active)) {
			return ask, true
		}
	}
	return authority.CapacityVector{}, false
}

// Credit records in the ledger that shard returned returned (its slice's
// Returned figure): the shard's Taken becomes the larger of the two,
// counter by counter; a figure applied before changes nothing. A figure
// above what the ledger ever gave the shard is refused
// (ErrInvalidArgument). It returns the ledger after.
func (b BudgetSteps) Credit(ctx context.Context, node authority.NodeDescriptor, lifecycle int64, shard int, returned schema.Budget) (schema.BudgetLedger, error) {
	if err := b.begin(ctx, node, lifecycle, true); err != nil {
		return schema.BudgetLedger{}, err
	}
	if err := checkShard(shard); err != nil {
		return schema.BudgetLedger{}, err
	}
	if err := returned.CheckStored(); err != nil {
		return schema.BudgetLedger{}, authority.Wrap(authority.ErrInvalidArgument, "budget to credit", err)
	}
	key := b.s.keys.BudgetLedger(node, lifecycle)
	for attempt := 0; attempt < maxAttempts; attempt++ {
		cur, rev, err := readOne(ctx, b.s, key, decodeLedger)
		if err != nil {
			return schema.BudgetLedger{}, err
		}
		line := cur.Shards[shard]
		if line.Taken.Covers(returned) {
			return cur, nil // credited already
		}
		if !line.Given.Covers(returned) {
			return cur, authority.Wrap(authority.ErrInvalidArgument, fmt.Sprintf("shard %d cannot have returned more budget than the ledger gave it", shard), nil)
		}
		next := withLine(cur, shard)
		line.Taken = line.Taken.Max(returned)
		next.Shards[shard] = line
		if ok, err := b.put(ctx, key, rev, next.Encode(), nil, "the budget credit"); err != nil || ok {
			return next, err
		}
	}
	return schema.BudgetLedger{}, contended("crediting budget")
}

// Ledgers lists the node lifecycles with a ledger in this cluster. A ledger
// key that names no node lifecycle is skipped and reported (ErrCorrupt)
// with the others.
func (b BudgetSteps) Ledgers(ctx context.Context) ([]NodeLifecycle, error) {
	s := b.s
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	rctx, cancel := s.requestContext(ctx)
	defer cancel()
	kvs, _, err := etcdpage.All(rctx, s.kv, s.keys.BudgetLedgersPrefix(), 0, 500)
	if err != nil {
		return nil, mapError(err, false)
	}
	var out []NodeLifecycle
	var bad error
	for _, kv := range kvs {
		e, err := schema.DecodeEntry(s.keys.Namespace(), kv)
		if err != nil || e.BudgetLedger == nil {
			bad = cmp.Or(bad, err, error(authority.Wrap(authority.ErrCorrupt, "etcd key "+string(kv.Key)+" is not a ledger", nil)))
			continue
		}
		out = append(out, NodeLifecycle{Node: e.Node, Lifecycle: e.Lifecycle})
	}
	return out, bad
}

func checkShard(shard int) error {
	if shard < 0 || shard >= 1<<16 {
		return authority.Invalid(fmt.Sprintf("shard index %d is outside 0..65535.", shard))
	}
	return nil
}

// withLine returns a copy of l that has a line for shard.
func withLine(l schema.BudgetLedger, shard int) schema.BudgetLedger {
	next := schema.BudgetLedger{Shards: map[int]schema.LedgerShard{}}
	for i, line := range l.Shards {
		next.Shards[i] = line
	}
	if _, ok := next.Shards[shard]; !ok {
		next.Shards[shard] = schema.LedgerShard{Given: schema.Budget{}, Taken: schema.Budget{}}
	}
	return next
}

func decodeSlice(kv *mvccpbKV) (schema.BudgetSlice, error) {
	if kv == nil {
		return schema.BudgetSlice{Received: schema.Budget{}, Returned: schema.Budget{}}, nil
	}
	return schema.DecodeBudgetSlice(kv)
}

func decodeLedger(kv *mvccpbKV) (schema.BudgetLedger, error) {
	if kv == nil {
		return schema.BudgetLedger{Shards: map[int]schema.LedgerShard{}}, nil
	}
	return schema.DecodeBudgetLedger(kv)
}

// readOne reads key and decodes it, with its ModRevision (0: absent).
func readOne[T any](ctx context.Context, s *Store, key string, decode func(*mvccpbKV) (T, error)) (T, int64, error) {
	var zero T
	resp, err := s.read(ctx, opGet(key))
	if err != nil {
		return zero, 0, err
	}
	kv := txnkit.KVNamed(resp, key)
	v, err := decode(kv)
	if err != nil {
		return zero, 0, err
	}
	return v, recordRev(kv), nil
}

// put writes value at key if its ModRevision is still rev (and cmps hold):
// false when a compare failed. The Txn is never merged with other writes.
func (b BudgetSteps) put(ctx context.Context, key string, rev int64, value string, cmps []clientv3.Cmp, what string) (bool, error) {
	t := &txnkit.Txn{Alone: true}
	t.Cmp(modRevIs(key, rev))
	for _, c := range cmps {
		t.Cmp(c)
	}
	t.Put(key, value)
	resp, err := b.s.sendWrite(ctx, t, what)
	if err != nil {
		return false, err
	}
	return resp.Succeeded, nil
}

func contended(what string) error {
	return authority.Wrap(authority.ErrUnavailable, what+" gave up after repeated contention", errContention)
}
