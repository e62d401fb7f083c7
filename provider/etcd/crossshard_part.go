package etcd

import (
	"context"
	"fmt"
	"time"

	authority "github.com/zlink-systems/authority"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/zlink-systems/authority/internal/observe"
	"github.com/zlink-systems/authority/provider/etcd/internal/txnkit"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/etcd/storeversion"
)

// The participant side of a cross-shard aggregate (see CrossShard): the
// checks of a prepare, the row locks of a commit attempt, the apply of a
// committed aggregate's part and the release of locks.

// LockAttempt names one commit attempt of a cross-shard aggregate: a random
// ID (32 lowercase hex digits) and the record revision the attempt started
// from.
type LockAttempt struct {
	// ID is the attempt's random ID.
	ID string
	// Base is the record's revision when the attempt started.
	Base int64
}

// LockKind is the outcome of LockParticipants.
type LockKind int

// LockParticipants outcomes.
const (
	// LockHeld: every participant row of the shard is locked by the
	// attempt (now or already).
	LockHeld LockKind = iota
	// LockStale: a row is missing, not active or not at its expected
	// version, or an owner the commit needs live is not; nothing written.
	LockStale
	// LockBlocked: rows are locked by another aggregate, another
	// incarnation, or an attempt not earlier than this one (Locks);
	// nothing written.
	LockBlocked
)

// LockResult is the outcome of LockParticipants.
type LockResult struct {
	// Kind is the outcome.
	Kind LockKind
	// Locks are the attempt's locks (LockHeld) or the locks in the way
	// (LockBlocked).
	Locks []RowLock
	// Reason says why the shard is stale (LockStale).
	Reason string
	// Unreserved says the shard is stale because the target capacity the
	// commit moves into it is not reserved there (a prepare that stopped
	// before ReservePart): reserve it, and lock again.
	Unreserved bool
}

// LockSelector selects the locks ReleaseLocks releases: those of Fence and
// Incarnation, and of the attempt ID Attempt unless it is empty, and only
// the one at Revision unless it is 0.
type LockSelector struct {
	// Fence is the aggregate's.
	Fence authority.Fence
	// Incarnation is the record's incarnation ("": any).
	Incarnation string
	// Attempt is the attempt's ID ("": any).
	Attempt string
	// Revision is the one lock's ModRevision (0: any).
	Revision int64
}

func (sel LockSelector) matches(l schema.RowLock, rev int64) bool {
	return l.Fence == sel.Fence && (sel.Incarnation == "" || l.Incarnation == sel.Incarnation) &&
		(sel.Attempt == "" || l.Attempt == sel.Attempt) && (sel.Revision == 0 || rev == sel.Revision)
}

// participantsAt returns rec's participants at keys, in keys' order.
func participantsAt(rec *CrossRecord, keys []authority.Key) ([]authority.AggregateParticipant, error) {
	if len(keys) == 0 {
		return nil, authority.Invalid("no participant keys")
	}
	parts := make([]authority.AggregateParticipant, 0, len(keys))
	seen := map[authority.Key]bool{}
	for _, k := range keys {
		i := participantIndex(&rec.Request, k)
		if i < 0 || seen[k] {
			return nil, authority.Invalid(fmt.Sprintf("key %q is not a participant of aggregate %s/%d, or named twice", k, rec.Request.AggregateID, rec.Request.AggregateGeneration))
		}
		seen[k] = true
		parts = append(parts, rec.Request.Participants[i])
	}
	return parts, nil
}

func participantIndex(req *authority.AggregatePrepareRequest, key authority.Key) int {
	for i, p := range req.Participants {
		if p.AuthorityKey == key {
			return i
		}
	}
	return -1
}

// readRowsAndLocks reads the rows and row locks at keys (and extra keys).
func (s *Store) readRowsAndLocks(ctx context.Context, keys []authority.Key, extra ...string) (txnkit.Reads, error) {
	gets := make([]clientv3.Op, 0, 2*len(keys)+len(extra))
	for _, k := range keys {
		gets = append(gets, opGet(s.keys.Row(k)), opGet(s.keys.RowLock(k)))
	}
	for _, k := range extra {
		gets = append(gets, opGet(k))
	}
	return s.readInParts(ctx, gets)
}

// lockAt decodes the row lock of key in got (nil: none).
func (s *Store) lockAt(got txnkit.Reads, key authority.Key) (*RowLock, error) {
	kv := got[s.keys.RowLock(key)]
	if kv == nil {
		return nil, nil
	}
	l, err := schema.DecodeRowLock(kv)
	if err != nil {
		return nil, err
	}
	return &RowLock{Key: key, Lock: l, Revision: kv.ModRevision}, nil
}

// CheckParticipants reads the rows at keys, and the liveness of their
// owners on their nodes, for a cross-shard prepare (PrepareCrossShard in
// the coordinator shard judges them). A store whose namespace is not at
// storeversion.RowLocks refuses (ErrNotFinalized): the commit could not
// lock its rows.
func (c CrossShard) CheckParticipants(ctx context.Context, keys []authority.Key) ([]ParticipantCheck, error) {
	s := c.s
	for _, k := range keys {
		if err := authority.ValidateKey(k); err != nil {
			return nil, err
		}
	}
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	if !s.atLeast(storeversion.RowLocks) {
		return nil, s.notFinalized("a cross-shard aggregate")
	}
	gets := make([]clientv3.Op, len(keys))
	for i, k := range keys {
		gets[i] = opGet(s.keys.Row(k))
	}
	got, err := s.readInParts(ctx, gets)
	if err != nil {
		return nil, err
	}
	out := make([]ParticipantCheck, len(keys))
	var lives []clientv3.Op
	for i, k := range keys {
		r, err := s.rowIn(got, k)
		if err != nil {
			return nil, err
		}
		out[i].Key = k
		if r == nil {
			continue
		}
		out[i].Row = r.Snapshot(s.clock.Now())
		lives = append(lives, clientv3.OpGet(s.keys.Liveness(r.Alloc.Descriptor, r.Alloc.DescriptorLifecycleGeneration, r.Owner), clientv3.WithKeysOnly()))
	}
	if len(lives) == 0 {
		return out, nil
	}
	lresp, err := s.read(ctx, lives...)
	if err != nil {
		return nil, err
	}
	live := txnkit.ReadsOf(lresp)
	for i := range out {
		if r := out[i].Row; r != nil {
			out[i].OwnerLive = live[s.keys.Liveness(r.Allocation.Descriptor, r.Allocation.DescriptorLifecycleGeneration, r.Owner())] != nil
		}
	}
	return out, nil
}

// LockParticipants locks rec's participant rows at keys (all of them in
// this store) for the commit attempt att, in one Txn comparing, for each
// row, its version with the expected one, the liveness of the owner the
// commit needs (a preserve row's owner; a newOwner row's target) and its
// lock: absent, or one of an earlier attempt of the same incarnation,
// which it replaces. Locks the attempt already holds are kept (a retry is
// idempotent). Nothing is written unless every row can be locked.
func (c CrossShard) LockParticipants(ctx context.Context, rec *CrossRecord, keys []authority.Key, att LockAttempt) (LockResult, error) {
	s := c.s
	if err := c.checkRecord(rec, schema.AggregatePrepared, false); err != nil {
		return LockResult{}, err
	}
	if !validID(att.ID) || att.Base < 1 {
		return LockResult{}, authority.Invalid("a lock attempt needs a random ID (32 lowercase hex digits) and a base revision")
	}
	parts, err := participantsAt(rec, keys)
	if err != nil {
		return LockResult{}, err
	}
	if err := s.begin(ctx); err != nil {
		return LockResult{}, err
	}
	moving, err := movesIn(rec, keys)
	if err != nil {
		return LockResult{}, err
	}
	var extra []string
	part := ""
	if len(moving) > 0 {
		part = s.partKey(&rec.Request)
		extra = append(extra, part)
	}
	got, err := s.readRowsAndLocks(ctx, keys, extra...)
	if err != nil {
		return LockResult{}, err
	}
	for attempt := 0; attempt < maxAttempts; attempt++ {
		b := &lockBuild{s: s, rec: rec, att: att, t: &txnkit.Txn{}, lives: map[string]bool{}, part: part}
		if out, err := b.build(parts, got); err != nil || out != nil {
			return derefLock(out), err
		}
		resp, err := s.sendRaw(ctx, b.t, "locking a cross-shard aggregate's rows")
		if err != nil {
			return LockResult{}, err
		}
		if resp.Succeeded {
			for i := range b.held {
				if b.held[i].Revision == 0 {
					b.held[i].Revision = resp.Header.Revision
				}
			}
			return LockResult{Kind: LockHeld, Locks: b.held}, nil
		}
		got = txnkit.ReadsOf(resp)
		for lk := range b.lives {
			if got[lk] == nil {
				return LockResult{Kind: LockStale, Reason: "an owner the commit needs live is not: " + lk}, nil
			}
		}
	}
	return LockResult{}, authority.Wrap(authority.ErrUnavailable, "locking a cross-shard aggregate's rows gave up after repeated contention", errContention)
}

func derefLock(r *LockResult) LockResult {
	if r == nil {
		return LockResult{}
	}
	return *r
}

// validID reports whether id is a random ID as randomID makes them.
func validID(id string) bool {
	if len(id) != 32 {
		return false
	}
	for _, c := range id {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// lockBuild is one attempt's lock Txn being built.
type lockBuild struct {
	s        *Store
	rec      *CrossRecord
	att      LockAttempt
	t        *txnkit.Txn
	lives    map[string]bool // the liveness keys compared
	held     []RowLock       // the attempt's locks (Revision 0: put by t)
	blockers []RowLock
	puts     int
	part     string // the key of the capacity the commit moves in ("": none moves in)
}

// build adds every participant to b.t, or returns the outcome decided
// without a Txn (stale, blocked, or every lock already held).
func (b *lockBuild) build(parts []authority.AggregateParticipant, got txnkit.Reads) (*LockResult, error) {
	s := b.s
	mine := schema.RowLock{Fence: b.rec.Fence(), Incarnation: b.rec.Incarnation, Attempt: b.att.ID, Base: b.att.Base}
	for _, p := range parts {
		cur, err := s.lockAt(got, p.AuthorityKey)
		if err != nil {
			return nil, err
		}
		lockKey := s.keys.RowLock(p.AuthorityKey)
		switch {
		case cur != nil && cur.Lock == mine:
			b.t.Cmp(modRevIs(lockKey, cur.Revision))
			b.t.OrGet(lockKey)
			b.held = append(b.held, *cur)
			continue
		case cur != nil && cur.Lock.Fence == mine.Fence && cur.Lock.Incarnation == mine.Incarnation && cur.Lock.Base < mine.Base:
			b.t.Cmp(modRevIs(lockKey, cur.Revision)) // an earlier attempt's: replaced
		case cur != nil:
			b.blockers = append(b.blockers, *cur)
			continue
		default:
			b.t.Cmp(modRevIs(lockKey, 0))
		}
		b.t.OrGet(lockKey)
		if reason, err := b.fenceRow(p, got); err != nil || reason != "" {
			return &LockResult{Kind: LockStale, Reason: reason}, err
		}
		b.t.Put(lockKey, mine.Encode())
		b.held = append(b.held, RowLock{Key: p.AuthorityKey, Lock: mine})
		b.puts++
	}
	if len(b.blockers) > 0 {
		return &LockResult{Kind: LockBlocked, Locks: b.blockers}, nil
	}
	if b.puts == 0 {
		return &LockResult{Kind: LockHeld, Locks: b.held}, nil
	}
	if b.part != "" {
		// the capacity the commit moves into this shard is reserved here
		// (crossshard_capacity.go), and stays while the rows are locked
		kv := got[b.part]
		if kv == nil {
			return &LockResult{Kind: LockStale, Reason: "the aggregate's capacity is not reserved in this shard", Unreserved: true}, nil
		}
		b.t.Cmp(modRevIs(b.part, kv.ModRevision))
		b.t.OrGet(b.part)
	}
	return nil, s.rowLocksFence(b.t, "a cross-shard aggregate")
}

// fenceRow compares p's row at its expected version and the liveness of
// the owner the commit needs; it returns why the row cannot be locked ("":
// it can).
func (b *lockBuild) fenceRow(p authority.AggregateParticipant, got txnkit.Reads) (string, error) {
	s, req := b.s, &b.rec.Request
	r, err := s.rowIn(got, p.AuthorityKey)
	if err != nil {
		return "", err
	}
	if r == nil || r.Alloc.State != authority.AllocationActive || r.Version() != p.ExpectedStoreVersion {
		return fmt.Sprintf("row %q is not active at version %s", p.AuthorityKey, p.ExpectedStoreVersion), nil
	}
	rowKey := s.keys.Row(p.AuthorityKey)
	b.t.Cmp(modRevIs(rowKey, r.ModRev))
	b.t.OrGet(rowKey)
	node, lifecycle, owner := r.Alloc.Descriptor, r.Alloc.DescriptorLifecycleGeneration, r.Owner
	if p.OwnerTransition == authority.TransitionNewOwner {
		node, lifecycle, owner = req.TargetDescriptor, req.TargetDescriptorLifecycleGeneration, req.TargetOwner
	}
	if lk := s.keys.Liveness(node, lifecycle, owner); !b.lives[lk] {
		b.lives[lk] = true
		b.t.Cmp(s.liveCmp(node, lifecycle, owner))
		b.t.OrGet(lk, clientv3.WithKeysOnly())
	}
	return "", nil
}

// ApplyParticipants applies the committed rec's part at keys (all in this
// store): in one Txn comparing each row's lock of rec's incarnation, each
// row gets its payload (a newOwner row moves to the target, with its
// capacity entry and owner index) and its lock is deleted, and the part
// marker records the ownership tokens. Rows without such a lock were
// applied before (a shard applies its part in one Txn): then it returns
// the tokens the marker recorded (none once the marker expired). It returns
// the newOwner rows' ownership tokens.
func (c CrossShard) ApplyParticipants(ctx context.Context, rec *CrossRecord, keys []authority.Key) (map[authority.Key]int64, error) {
	s := c.s
	if err := c.checkRecord(rec, schema.AggregateCommitted, false); err != nil {
		return nil, err
	}
	parts, err := participantsAt(rec, keys)
	if err != nil {
		return nil, err
	}
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	partKey := s.keys.AggregatePart(rec.Fence())
	got, err := s.readRowsAndLocks(ctx, keys, partKey)
	if err != nil {
		return nil, err
	}
	for attempt := 0; attempt < maxAttempts; attempt++ {
		t, next, err := c.buildApply(rec, parts, got)
		if err != nil {
			return nil, err
		}
		if len(next) == 0 {
			return c.markedTokens(rec, got[partKey])
		}
		c.convertPart(t, rec, next)
		t.OrGet(partKey)
		resp, err := c.sendApply(ctx, t, rec, partKey, next)
		if err != nil {
			return nil, err
		}
		if !resp.Succeeded {
			got = txnkit.ReadsOf(resp)
			continue
		}
		tokens := map[authority.Key]int64{}
		for _, n := range next {
			n.Written(resp.Header.Revision)
			s.remember(n)
			if newOwner(&rec.Request, n.Key) {
				tokens[n.Key] = n.Token
			}
		}
		return tokens, nil
	}
	return nil, authority.Wrap(authority.ErrUnavailable, "applying a cross-shard aggregate gave up after repeated contention", errContention)
}

// convertPart adds to the apply t the release of the capacity the prepare
// reserved in this shard for the rows it moves onto the target (next, as
// written): their own entries hold it from t on.
func (c CrossShard) convertPart(t *txnkit.Txn, rec *CrossRecord, next []*schema.Row) {
	for _, n := range next {
		if newOwner(&rec.Request, n.Key) {
			reserved := rec.Request.TargetAllocation()
			reserved.State = authority.AllocationReserved
			t.Del(c.s.partKey(&rec.Request))
			c.s.touchCapacity(t, reserved)
			return
		}
	}
}

// newOwner reports whether key is a newOwner participant of req.
func newOwner(req *authority.AggregatePrepareRequest, key authority.Key) bool {
	i := participantIndex(req, key)
	return i >= 0 && req.Participants[i].OwnerTransition == authority.TransitionNewOwner
}

// buildApply builds the apply of the participants whose rows still hold a
// lock of rec's incarnation, and returns the rows as it writes them (none:
// the part was applied).
func (c CrossShard) buildApply(rec *CrossRecord, parts []authority.AggregateParticipant, got txnkit.Reads) (*txnkit.Txn, []*schema.Row, error) {
	s := c.s
	t := &txnkit.Txn{}
	var next []*schema.Row
	for _, p := range parts {
		l, err := s.lockAt(got, p.AuthorityKey)
		if err != nil {
			return nil, nil, err
		}
		if l == nil || l.Lock.Fence != rec.Fence() || l.Lock.Incarnation != rec.Incarnation {
			continue // applied (the row may be locked by another aggregate since)
		}
		r, err := s.rowIn(got, p.AuthorityKey)
		if err != nil {
			return nil, nil, err
		}
		if r == nil || r.Version() != p.ExpectedStoreVersion {
			// only a writer that ignores row locks (a build before
			// storeversion.RowLocks) can change a locked row
			return nil, nil, authority.Wrap(authority.ErrCorrupt, fmt.Sprintf("row %q changed while locked by aggregate %s/%d (written by a process that ignores row locks?)",
				p.AuthorityKey, rec.Request.AggregateID, rec.Request.AggregateGeneration), nil)
		}
		lockKey, rowKey := s.keys.RowLock(p.AuthorityKey), s.keys.Row(p.AuthorityKey)
		t.Cmp(modRevIs(lockKey, l.Revision))
		t.Cmp(modRevIs(rowKey, r.ModRev))
		t.OrGet(lockKey)
		t.OrGet(rowKey)
		next = append(next, s.rewriteParticipant(t, &rec.Request, p, r))
		t.Del(lockKey)
	}
	return t, next, nil
}

// sendApply sends t with the put of the part marker (the rows' tokens) on a
// lease of the store's retention.
func (c CrossShard) sendApply(ctx context.Context, t *txnkit.Txn, rec *CrossRecord, partKey string, next []*schema.Row) (*clientv3.TxnResponse, error) {
	s := c.s
	part := schema.AggregatePart{Incarnation: rec.Incarnation, Tokens: map[authority.Key]int64{}}
	for _, n := range next {
		if newOwner(&rec.Request, n.Key) {
			part.Tokens[n.Key] = n.Token // 0: the marker's (the Txn's) revision
		}
	}
	var resp *clientv3.TxnResponse
	err := s.leases.withLeases(ctx, []time.Duration{s.retention}, func(ids []clientv3.LeaseID) error {
		tt := t.Clone()
		tt.Put(partKey, part.Encode(), clientv3.WithLease(ids[0]))
		var err error
		resp, err = s.sendRaw(ctx, tt, "applying a cross-shard aggregate")
		return err
	})
	return resp, err
}

// markedTokens returns the tokens of the part marker kv when it is rec's
// (nil otherwise: none, expired or of another incarnation).
func (c CrossShard) markedTokens(rec *CrossRecord, kv *mvccpbKV) (map[authority.Key]int64, error) {
	if kv == nil {
		return nil, nil
	}
	p, err := schema.DecodeAggregatePart(kv)
	if err != nil || p.Incarnation != rec.Incarnation {
		return nil, err
	}
	return p.Tokens, nil
}

// ReleaseLocks deletes the row locks at keys that sel selects, each fenced
// on its revision, and returns how many. A lock not there (applied,
// released, or another's) is left.
func (c CrossShard) ReleaseLocks(ctx context.Context, keys []authority.Key, sel LockSelector) (int, error) {
	s := c.s
	if err := authority.ValidateFence(sel.Fence); err != nil {
		return 0, err
	}
	if err := s.refuseWrite(); err != nil {
		return 0, err
	}
	if err := s.begin(ctx); err != nil {
		return 0, err
	}
	gets := make([]clientv3.Op, len(keys))
	for i, k := range keys {
		if err := authority.ValidateKey(k); err != nil {
			return 0, err
		}
		gets[i] = opGet(s.keys.RowLock(k))
	}
	got, err := s.readInParts(ctx, gets)
	if err != nil {
		return 0, err
	}
	for attempt := 0; attempt < maxAttempts; attempt++ {
		t := &txnkit.Txn{}
		n := 0
		for _, k := range keys {
			l, err := s.lockAt(got, k)
			if err != nil {
				return 0, err
			}
			t.OrGet(s.keys.RowLock(k))
			if l != nil && sel.matches(l.Lock, l.Revision) {
				t.Cmp(modRevIs(s.keys.RowLock(k), l.Revision))
				t.Del(s.keys.RowLock(k))
				n++
			}
		}
		if n == 0 {
			return 0, nil
		}
		resp, err := s.sendRaw(ctx, t, "releasing row locks")
		if err != nil {
			return 0, err
		}
		if resp.Succeeded {
			return n, nil
		}
		got = txnkit.ReadsOf(resp)
	}
	return 0, authority.Wrap(authority.ErrUnavailable, "releasing row locks gave up after repeated contention", errContention)
}

// ReadLocked reads the row at key and its row lock at one revision: a
// sharded store's read resolves a lock of a decided aggregate before it
// answers. It is observed as a read (ReadAuthority's metrics and span).
func (c CrossShard) ReadLocked(ctx context.Context, key authority.Key) (res authority.ReadResult, l *RowLock, err error) {
	ctx, op := c.s.obs.Start(ctx, observe.OpRead)
	defer func() { op.End(res.Kind, err) }()
	return c.readLocked(ctx, key)
}

func (c CrossShard) readLocked(ctx context.Context, key authority.Key) (authority.ReadResult, *RowLock, error) {
	s := c.s
	if err := authority.ValidateKey(key); err != nil {
		return authority.ReadResult{}, nil, err
	}
	if err := s.begin(ctx); err != nil {
		return authority.ReadResult{}, nil, err
	}
	resp, err := s.read(ctx, opGet(s.keys.Row(key)), opGet(s.keys.RowLock(key)))
	if err != nil {
		return authority.ReadResult{}, nil, err
	}
	got := txnkit.ReadsOf(resp)
	r, err := s.rowIn(got, key)
	if err != nil {
		return authority.ReadResult{}, nil, err
	}
	l, err := s.lockAt(got, key)
	if err != nil {
		return authority.ReadResult{}, nil, err
	}
	return s.readResult(r), l, nil
}
