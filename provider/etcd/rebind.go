package etcd

import (
	"context"
	"fmt"
	"strings"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/internal/observe"
	"github.com/zlink-systems/authority/provider/etcd/internal/txnkit"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/etcd/storeversion"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Batched rebind.
//
// RebindRows moves the rows of an older lease generation (from) onto a
// lease many rows a Txn. Each row in a Txn keeps the fences a single
// rebindOwnerLease compare-exchange has: the row's ModRevision as read, and
// the new lease's liveness key on the row's node (one compare per node in
// the Txn). Its ops are the row rewritten with the new owner (payload
// kept), the old owner index entry deleted and the new one put; a Txn
// takes as many rows as fit --max-txn-ops and the request-size limit. Its
// Else reads every row and liveness key it compares, so a Txn that did not
// apply says, in the same round trip, which rows changed (they are judged
// again from what Else read: moved on from the new state, or left to the
// writer that changed them) and whether the lease is gone (ErrLeaseLost);
// the rows that did not change are sent again as they were.

// rebindRow is one row of from being moved: its key, its state as last
// read, and how many Txns found it changed.
type rebindRow struct {
	key     authority.Key
	row     *schema.Row
	changed int
}

// rebinder moves the rows of from onto the lease l.
type rebinder struct {
	l     *OwnerLease
	s     *Store
	from  authority.OwnerToken
	moved int64
	left  []authority.Key // rows that changed under every attempt
	nodes []nodeLifecycle // the node lifecycles from's directory named (read by readAll)
}

// rebindRows moves every row of from (an older lease generation of the same
// owner) onto this lease, keeping payloads, in batched Txns (see above). It
// returns how many rows it moved; a row that changed meanwhile is judged
// again, a reserved row is left to its creation and a row that left from is
// left to its new writer. A row that changed under maxAttempts Txns stays
// on from: the other rows are still moved, and the error (wrapping
// ErrUnavailable) says how many stayed, so the caller calls it again. Onto
// a lease that is lost nothing can move: the error wraps ErrLeaseLost. A
// from that is not an earlier generation of this lease's owner is refused
// before anything is read or written (validateRebindFrom).
func (l *OwnerLease) rebindRows(ctx context.Context, from authority.OwnerToken) (int64, error) {
	if err := validateRebindFrom(from, l.token); err != nil {
		return 0, err
	}
	s := l.r.s
	if err := s.begin(ctx); err != nil {
		return 0, err
	}
	rb := &rebinder{l: l, s: s, from: from}
	if err := rb.lost(); err != nil {
		return 0, err
	}
	// the old index and its rows are read ahead, one Txn's worth at a
	// time, while the rows read before are sent
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	chunks := make(chan []*rebindRow, 2)
	var readErr error
	go func() {
		defer close(chunks)
		readErr = rb.readAll(rctx, chunks)
	}()
	var err error
	for chunk := range chunks {
		if err == nil {
			if err = rb.move(ctx, chunk); err != nil {
				cancel() // the reader stops; the chunks it sent are dropped
			}
		}
	}
	if err == nil {
		err = readErr // closing chunks ordered the reader's write before this
	}
	if err != nil {
		return rb.moved, err
	}
	rb.dropDirectory(ctx)
	if len(rb.left) > 0 {
		return rb.moved, authority.Wrap(authority.ErrUnavailable,
			fmt.Sprintf("rebind left %d rows on the old lease generation after %d conflicting attempts each (first: %s); call RebindRows again", len(rb.left), maxAttempts, rb.left[0]),
			errContention)
	}
	return rb.moved, nil
}

// validateRebindFrom checks what the per-row rebind (ValidateMutation of a
// RebindOwnerLease) checks, and that from is older than to: a rebind keeps
// the owner and moves its rows from an earlier lease generation onto a
// later one. A live owner's rows (another owner's token) and the lease's
// own rows (its own token) are never from.
func validateRebindFrom(from, to authority.OwnerToken) error {
	if err := authority.ValidateOwner(from); err != nil {
		return err
	}
	if from.OwnerID != to.OwnerID || from.LeaseGeneration <= 0 || from.LeaseGeneration >= to.LeaseGeneration {
		return authority.Wrap(authority.ErrInvalidArgument,
			"Authority lease rebind must retain the owner and change the lease generation.",
			fmt.Errorf("RebindRows moves the rows of an earlier lease generation of its own owner: %s generation %d is not an earlier lease generation of its own owner %s (this lease: generation %d)",
				from.OwnerID, from.LeaseGeneration, to.OwnerID, to.LeaseGeneration))
	}
	return nil
}

// lost is ErrLeaseLost once the lease is known lost.
func (rb *rebinder) lost() error {
	select {
	case <-rb.l.done:
		return rb.lostError()
	default:
		return nil
	}
}

func (rb *rebinder) lostError() error {
	return fmt.Errorf("%w: rebind stopped after moving %d rows; acquire a new generation and rebind onto it", ErrLeaseLost, rb.moved)
}

// movable says whether r is a row rebind moves: active and held by from.
func (rb *rebinder) movable(r *schema.Row) bool {
	return r != nil && r.Owner == rb.from && r.Alloc.State == authority.AllocationActive
}

// readAll reads the rows of from: those placed before
// storeversion.FewerKeys through its owner index, then those with placement
// keys through the node lifecycles its directory names (placement.go).
func (rb *rebinder) readAll(ctx context.Context, chunks chan<- []*rebindRow) error {
	s := rb.s
	if err := rb.read(ctx, s.keys.OwnerRowsPrefix(rb.from), chunks); err != nil {
		return err
	}
	nodes, err := s.ownerNodes(ctx, rb.from)
	if err != nil {
		return err
	}
	rb.nodes = nodes
	for _, at := range nodes {
		if err := rb.read(ctx, s.keys.PlacementOwnerPrefix(at.node, at.lifecycle, rb.from), chunks); err != nil {
			return err
		}
	}
	return nil
}

// dropDirectory deletes the directory keys of from whose placement range
// the rebind left empty (best effort: a range still holding rows, a
// reserved row left to its creation for one, keeps its key; an error is
// left to the next RemoveAllByOwner or PruneCapacityEpochs).
func (rb *rebinder) dropDirectory(ctx context.Context) {
	for _, at := range rb.nodes {
		if _, err := rb.s.dropOwnerNode(ctx, rb.from, at); err != nil {
			return
		}
	}
}

// read reads the rows one index of from names (prefix: its owner index or
// its placement keys on one node lifecycle) a page at a time, and sends the
// movable ones to chunks, a Txn's worth (by --max-txn-ops) a chunk. It
// returns at the index's end or on an error.
func (rb *rebinder) read(ctx context.Context, prefix string, chunks chan<- []*rebindRow) error {
	s := rb.s
	per := rb.rowsPerTxn()
	var chunk []*rebindRow
	emit := func(all bool) error {
		for len(chunk) >= per || (all && len(chunk) > 0) {
			n := min(per, len(chunk))
			select {
			case chunks <- chunk[:n:n]:
			case <-ctx.Done():
				return ctx.Err()
			}
			chunk = chunk[n:]
		}
		return nil
	}
	for cursor := prefix; ; {
		keys, more, err := s.readOwnerIndex(ctx, prefix, cursor)
		if err != nil {
			return err
		}
		for start := 0; start < len(keys); start += per {
			rows, err := rb.readRows(ctx, keys[start:min(start+per, len(keys))])
			if err != nil {
				return err
			}
			chunk = append(chunk, rows...)
			if err := emit(false); err != nil {
				return err
			}
		}
		if !more || len(keys) == 0 {
			return emit(true)
		}
		cursor = prefix + string(keys[len(keys)-1]) + "\x00"
	}
}

// readRows reads the rows at keys (at most --max-txn-ops) and returns the
// movable ones.
func (rb *rebinder) readRows(ctx context.Context, keys []authority.Key) ([]*rebindRow, error) {
	s := rb.s
	gets := make([]clientv3.Op, len(keys))
	for i, key := range keys {
		gets[i] = opGet(s.keys.Row(key))
	}
	got, err := s.readInParts(ctx, gets)
	if err != nil {
		return nil, err
	}
	var rows []*rebindRow
	for _, key := range keys {
		r, err := s.rowIn(got, key)
		if err != nil {
			return nil, err
		}
		if rb.movable(r) {
			rows = append(rows, &rebindRow{key: key, row: r})
		}
	}
	return rows, nil
}

// move sends Txns until every row of pending is moved, left to another
// writer or given up on.
func (rb *rebinder) move(ctx context.Context, pending []*rebindRow) error {
	for len(pending) > 0 {
		t, n := rb.build(pending)
		again, err := rb.send(ctx, t, pending[:n])
		if err != nil {
			return err
		}
		pending = append(again, pending[n:]...)
	}
	return nil
}

// rowsPerTxn is how many rows a Txn moves (a chunk of the reader's): 3
// operations a row (the row, its owner index entry or placement key deleted
// and put), and from storeversion.FewerKeys on the node's capacity epoch and
// the new generation's directory key once. A row of the earlier layout
// taking a placement key costs one more (its owner index entry deleted), so
// while rows move to the new layout a chunk may take two Txns.
func (rb *rebinder) rowsPerTxn() int {
	if rb.s.atLeast(storeversion.FewerKeys) {
		return max(1, (rb.s.maxOps-2)/3)
	}
	return max(1, rb.s.maxOps/3)
}

// build returns the Txn moving the first n rows of pending: as many as fit
// the store's limits (at least one; a row too large alone fails the send's
// limit check, naming the flag). Each row's ModRevision compare is its
// owner fence: the row was read held by from (movable), so a row whose
// owner is no longer from by the time the Txn applies fails the compare
// and is never moved. Where a row's capacity is held moves with its owner
// (placement.go: its owner index entry, or its placement key, which a row
// of the earlier layout takes from storeversion.FewerKeys on).
func (rb *rebinder) build(pending []*rebindRow) (t *txnkit.Txn, n int) {
	s, to := rb.s, rb.l.token
	t = &txnkit.Txn{}
	lives := map[string]bool{}
	for _, p := range pending {
		r := p.row
		rowKey := s.keys.Row(p.key)
		one := &txnkit.Txn{}
		next := s.moved(one, r, to, r.Alloc.Descriptor, r.Alloc.DescriptorLifecycleGeneration)
		next.Token = 0 // a new owner lease: resolved to this write's revision
		one.Cmp(modRevIs(rowKey, r.ModRev))
		one.OrGet(rowKey)
		s.lockFree(one, p.key)
		live := s.keys.Liveness(r.Alloc.Descriptor, r.Alloc.DescriptorLifecycleGeneration, to)
		if !lives[live] {
			one.Cmp(s.liveCmp(r.Alloc.Descriptor, r.Alloc.DescriptorLifecycleGeneration, to))
			one.OrGet(live, clientv3.WithKeysOnly())
		}
		one.Put(rowKey, s.rowValue(one, next))
		s.replace(one, r, next)
		if n > 0 && !(txnkit.Limits{MaxOps: s.maxOps, MaxBytes: s.maxBytes}).Fits(t, one) {
			break
		}
		lives[live] = true
		t.MergeOnce(one)
		n++
	}
	return t, n
}

// send sends t, which moves batch, and returns the rows to send again: none
// when it applied; when it did not, the rows Else read unchanged and the
// changed rows still to move (their state now as Else read it).
func (rb *rebinder) send(ctx context.Context, t *txnkit.Txn, batch []*rebindRow) (again []*rebindRow, err error) {
	s := rb.s
	resp, err := s.sendWrite(ctx, t, "rebinding an owner's rows")
	if err != nil {
		return nil, err
	}
	if resp.Succeeded {
		rb.moved += int64(len(batch))
		return nil, nil
	}
	got := txnkit.ReadsOf(resp)
	livePrefix, own := s.keys.LivenessPrefix(rb.l.token), s.keys.Liveness(rb.l.node, rb.l.lifecycle, rb.l.token)
	for _, c := range t.Cmps {
		key := string(c.KeyBytes())
		if !strings.HasPrefix(key, livePrefix) || got[key] != nil {
			continue
		}
		if key == own { // every write onto the lease fails
			return nil, rb.lostError()
		}
		return nil, rb.elsewhere(key, batch)
	}
	unchanged := 0
	for _, p := range batch {
		kv := got[s.keys.Row(p.key)]
		if kv != nil && kv.ModRevision == p.row.ModRev {
			again = append(again, p)
			unchanged++
			continue
		}
		cur, err := s.decodeRow(p.key, kv)
		if err != nil {
			return nil, err
		}
		if !rb.movable(cur) {
			continue // deleted, moved, or reserved again: its writer's now
		}
		if p.changed++; p.changed >= maxAttempts {
			rb.left = append(rb.left, p.key)
			continue
		}
		s.retrying(observe.OpRebindRows, p.changed)
		p.row = cur
		again = append(again, p)
	}
	if unchanged == len(batch) {
		// every compare read as holding, yet the Txn failed: nothing to
		// learn from Else; count it against the rows as contention
		return rb.contention(batch), nil
	}
	return again, nil
}

// contention counts a failed Txn against each row of batch, giving up on a
// row at maxAttempts, and returns the rows to send again.
func (rb *rebinder) contention(batch []*rebindRow) (again []*rebindRow) {
	for _, p := range batch {
		if p.changed++; p.changed >= maxAttempts {
			rb.left = append(rb.left, p.key)
			continue
		}
		again = append(again, p)
	}
	return again
}

// elsewhere is the error for rows whose node has no liveness key of the
// lease (live, the key a Txn compared): the rows are on another node or
// node lifecycle than the lease, and none can move onto it: a rebind
// passes rows between lease generations of one node lifecycle; rows move
// to another lifecycle with an aggregate (their capacity moves with them).
func (rb *rebinder) elsewhere(live string, batch []*rebindRow) error {
	s, l := rb.s, rb.l
	for _, p := range batch {
		a := p.row.Alloc
		if s.keys.Liveness(a.Descriptor, a.DescriptorLifecycleGeneration, l.token) != live {
			continue
		}
		where := fmt.Sprintf("row %s of %s generation %d is on node %s/%s at node lifecycle %d",
			p.key, rb.from.OwnerID, rb.from.LeaseGeneration, a.Descriptor.MeshName, a.Descriptor.RID, a.DescriptorLifecycleGeneration)
		if a.Descriptor == l.node {
			return authority.Invalid(fmt.Sprintf("%s, this lease at lifecycle %d: RebindRows moves rows within one node lifecycle; acquire the new generation on lifecycle %d to rebind them, or move them onto lifecycle %d with an aggregate (PrepareAggregate, TargetDescriptorLifecycleGeneration %d), or drop them with RemoveAllByOwner",
				where, l.lifecycle, a.DescriptorLifecycleGeneration, l.lifecycle, l.lifecycle))
		}
		return authority.Invalid(fmt.Sprintf("%s, this lease on node %s/%s at lifecycle %d: acquire the new generation on the rows' node and lifecycle, or move the rows with an aggregate",
			where, l.node.MeshName, l.node.RID, l.lifecycle))
	}
	return authority.Invalid("rows to rebind are on another node or node lifecycle than the lease")
}
