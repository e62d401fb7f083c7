package etcd

import (
	"context"
	"time"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/internal/observe"
	"github.com/zlink-systems/authority/provider/etcd/internal/txnkit"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/etcd/storeversion"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// sameTarget reports whether a reserved row was reserved for target (the
// contract's same-creation-target check; docs/glossary.md).
func sameTarget(r *schema.Row, t authority.CreationTarget) bool {
	return r.Alloc.Descriptor == t.Descriptor() && r.Alloc.DescriptorLifecycleGeneration == t.NodeLifecycleGeneration && r.Owner == t.Owner
}

// pendingMatches reports whether r is the reserved row of reservation id at
// version expected for target.
func pendingMatches(r *schema.Row, id string, expected authority.StoreVersion, target authority.CreationTarget) bool {
	return r != nil && r.Alloc.State == authority.AllocationReserved && r.Pending != nil &&
		r.Pending.ReservationID == id && r.Version() == expected && sameTarget(r, target)
}

// reservationState returns the unexpired state of a reservation terminal
// key-value ("" when missing or expired).
func (s *Store) reservationState(kv *mvccpbKV) (string, error) {
	if kv == nil {
		return "", nil
	}
	rec, err := schema.DecodeReservation(kv)
	if err != nil {
		return "", err
	}
	if !rec.ExpiresAt.After(s.clock.Now()) {
		return "", nil
	}
	return rec.State, nil
}

func (s *Store) reservationRecord(state string) (schema.ReservationTerminal, time.Duration) {
	return schema.ReservationTerminal{State: state, ExpiresAt: s.clock.Now().Add(s.retention)}, s.retention
}

// activate writes the reserved row cur as active with payload, turning its
// capacity entry from reserved to active, into t; it returns the new row
// (without its revision). committed, when not nil, is kept in the row: the
// reservation whose commit this is (storeversion.FewerKeys).
func (s *Store) activate(t *txnkit.Txn, cur *schema.Row, payload []byte, committed *schema.CommittedReservation) *schema.Row {
	next := cur.Next(0)
	next.Alloc = cur.Alloc.Clone()
	next.Alloc.State = authority.AllocationActive
	next.Pending = nil
	next.Committed = committed
	next.Payload = append([]byte(nil), payload...)
	t.Put(s.keys.Row(cur.Key), s.rowValue(t, next))
	s.putCapacity(t, next)
	return next
}

// dropReserved deletes the reserved row cur and where its capacity is
// held, into t.
func (s *Store) dropReserved(t *txnkit.Txn, cur *schema.Row) {
	t.Del(s.keys.Row(cur.Key))
	s.unplace(t, cur)
}

// commitReservation turns a reserved Spot into an active one: one Txn when the
// reserved row is in the cache, else a read and a Txn.
func (s *Store) commitReservation(ctx context.Context, req authority.CommitRequest) (authority.CommitResult, error) {
	key, err := authority.ValidateCommit(req)
	if err != nil {
		return authority.CommitResult{}, err
	}
	if err := s.begin(ctx); err != nil {
		return authority.CommitResult{}, err
	}
	rowKey, resKey := s.keys.Row(key), s.keys.Reservation(req.ReservationID)
	decide := func(resp *clientv3.TxnResponse) (*schema.Row, *authority.CommitResult, error) {
		got := txnkit.ReadsOf(resp)
		cur, err := s.rowIn(got, key)
		if err != nil {
			return nil, nil, err
		}
		state, err := s.reservationState(got[resKey])
		if err != nil {
			return nil, nil, err
		}
		// the reservation committed: its terminal says so, or the row it
		// made still names it (storeversion.FewerKeys)
		committed := state == schema.ReservationCommitted || s.committedBy(cur, req.ReservationID)
		if committed && cur != nil && cur.Alloc.State == authority.AllocationActive {
			return nil, &authority.CommitResult{Kind: authority.KindAlreadyCommitted, Ready: cur.Snapshot(s.clock.Now())}, nil
		}
		if !pendingMatches(cur, req.ReservationID, req.ExpectedStoreVersion, req.Target) {
			return nil, &authority.CommitResult{Kind: authority.KindStale}, nil
		}
		return cur, nil, nil
	}
	cur := s.cachedRow(key, req.ExpectedStoreVersion)
	if !pendingMatches(cur, req.ReservationID, req.ExpectedStoreVersion, req.Target) {
		resp, err := s.read(ctx, opGet(rowKey), opGet(resKey))
		if err != nil {
			return authority.CommitResult{}, err
		}
		c, out, err := decide(resp)
		if err != nil || out != nil {
			return derefCommit(out), err
		}
		cur = c
	}
	resp, next, err := s.sendCommit(ctx, req, cur)
	if err != nil {
		return authority.CommitResult{}, err
	}
	if !resp.Succeeded {
		_, out, err := decide(resp)
		if err != nil {
			return authority.CommitResult{}, err
		}
		if out == nil { // the row matched, so the owner is no longer live
			out = &authority.CommitResult{Kind: authority.KindStale}
		}
		return *out, nil
	}
	next.Written(resp.Header.Revision)
	s.remember(next)
	return authority.CommitResult{Kind: authority.KindCommitted, Ready: next.Snapshot(s.clock.Now())}, nil
}

// committedBy reports whether r is the row the reservation id's commit
// made, and still answers a retry of that commit (storeversion.FewerKeys).
func (s *Store) committedBy(r *schema.Row, id string) bool {
	return r != nil && r.Committed != nil && r.Committed.ID == id && r.Committed.Until.After(s.clock.Now())
}

// sendCommit sends the commit of the reserved row cur: the row active, its
// capacity entry active, fenced on the row's version and its owner's
// liveness; its Else reads the row and the reservation terminal. From
// storeversion.FewerKeys on the row keeps the reservation that committed it
// until the retention ends, and no reservation terminal is written (see
// committedBy); before, a reservation terminal on a lease says so. It
// returns the row as written (without its revision).
func (s *Store) sendCommit(ctx context.Context, req authority.CommitRequest, cur *schema.Row) (*clientv3.TxnResponse, *schema.Row, error) {
	rowKey, resKey := s.keys.Row(cur.Key), s.keys.Reservation(req.ReservationID)
	rec, ttl := s.reservationRecord(schema.ReservationCommitted)
	build := func(t *txnkit.Txn, committed *schema.CommittedReservation) *schema.Row {
		t.Cmp(modRevIs(rowKey, cur.ModRev))
		t.Cmp(s.liveCmp(cur.Alloc.Descriptor, cur.Alloc.DescriptorLifecycleGeneration, cur.Owner))
		t.OrGet(rowKey)
		t.OrGet(resKey)
		return s.activate(t, cur, req.ReadyPayload, committed)
	}
	if t := (&txnkit.Txn{}); s.fewerKeys(t) {
		next := build(t, &schema.CommittedReservation{ID: req.ReservationID, Until: rec.ExpiresAt})
		resp, err := s.sendWrite(ctx, t, "the commit")
		return resp, next, err
	}
	var resp *clientv3.TxnResponse
	var next *schema.Row
	err := s.leases.withLeases(ctx, []time.Duration{ttl}, func(ids []clientv3.LeaseID) error {
		t := &txnkit.Txn{}
		next = build(t, nil)
		t.Put(resKey, rec.Encode(), clientv3.WithLease(ids[0]))
		var err error
		resp, err = s.sendWrite(ctx, t, "the commit")
		return err
	})
	return resp, next, err
}

func derefCommit(r *authority.CommitResult) authority.CommitResult {
	if r == nil {
		return authority.CommitResult{}
	}
	return *r
}

// abort deletes a reserved row and releases its capacity: one Txn when the
// reserved row is in the cache, else a read and a Txn.
func (s *Store) abort(ctx context.Context, req authority.AbortRequest) (authority.AbortResult, error) {
	key, err := authority.ValidateAbort(req)
	if err != nil {
		return authority.AbortResult{}, err
	}
	if err := s.begin(ctx); err != nil {
		return authority.AbortResult{}, err
	}
	rowKey, resKey := s.keys.Row(key), s.keys.Reservation(req.ReservationID)
	cur := s.cachedRow(key, req.ExpectedStoreVersion)
	if !pendingMatches(cur, req.ReservationID, req.ExpectedStoreVersion, req.Target) {
		resp, err := s.read(ctx, opGet(rowKey), opGet(resKey))
		if err != nil {
			return authority.AbortResult{}, err
		}
		got := txnkit.ReadsOf(resp)
		state, err := s.reservationState(got[resKey])
		if err != nil {
			return authority.AbortResult{}, err
		}
		if state == schema.ReservationAborted {
			return authority.AbortResult{Kind: authority.KindAlreadyAborted}, nil
		}
		if cur, err = s.rowIn(got, key); err != nil {
			return authority.AbortResult{}, err
		}
		if !pendingMatches(cur, req.ReservationID, req.ExpectedStoreVersion, req.Target) {
			return authority.AbortResult{Kind: authority.KindStale}, nil
		}
	}
	rec, ttl := s.reservationRecord(schema.ReservationAborted)
	var resp *clientv3.TxnResponse
	err = s.leases.withLeases(ctx, []time.Duration{ttl}, func(ids []clientv3.LeaseID) error {
		t := &txnkit.Txn{}
		t.Cmp(modRevIs(rowKey, cur.ModRev))
		s.dropReserved(t, cur)
		t.Put(resKey, rec.Encode(), clientv3.WithLease(ids[0]))
		t.OrGet(resKey)
		var err error
		resp, err = s.sendWrite(ctx, t, "the abort")
		return err
	})
	if err != nil {
		return authority.AbortResult{}, err
	}
	if resp.Succeeded {
		return authority.AbortResult{Kind: authority.KindAborted}, nil
	}
	state, err := s.reservationState(txnkit.ReadsOf(resp)[resKey])
	if err != nil {
		return authority.AbortResult{}, err
	}
	if state == schema.ReservationAborted {
		return authority.AbortResult{Kind: authority.KindAlreadyAborted}, nil
	}
	return authority.AbortResult{Kind: authority.KindStale}, nil
}

// completeCreation finishes a reserved Actor and publishes its creation
// terminal in the same Txn.
func (s *Store) completeCreation(ctx context.Context, req authority.CompleteCreationRequest) (authority.CompleteCreationResult, error) {
	key, record, err := authority.ValidateCompleteCreation(req, s.clock.Now())
	if err != nil {
		return authority.CompleteCreationResult{}, err
	}
	if err := s.begin(ctx); err != nil {
		return authority.CompleteCreationResult{}, err
	}
	c := &creationCompletion{s: s, req: &req, key: key, record: record,
		rowKey: s.keys.Row(key), resKey: s.keys.Reservation(req.ReservationID), termKey: s.keys.Terminal(record.Operation)}
	cur := s.cachedRow(key, req.ExpectedStoreVersion)
	var termRev int64
	if !pendingMatches(cur, req.ReservationID, req.ExpectedStoreVersion, req.Target) {
		cur = nil
	}
	for attempt := 0; attempt < maxAttempts; attempt++ {
		s.retrying(observe.OpCompleteCreation, attempt)
		if cur == nil {
			resp, err := s.read(ctx, opGet(c.rowKey), opGet(c.resKey), opGet(c.termKey))
			if err != nil {
				return authority.CompleteCreationResult{}, err
			}
			r, rev, out, err := c.decide(resp, "")
			if err != nil || out != nil {
				return derefComplete(out), err
			}
			cur, termRev = r, rev
		}
		out, resp, err := c.send(ctx, cur, termRev)
		if err != nil || out != nil {
			return derefComplete(out), err
		}
		liveKey := s.keys.Liveness(cur.Alloc.Descriptor, cur.Alloc.DescriptorLifecycleGeneration, cur.Owner)
		r, rev, out, err := c.decide(resp, liveKey)
		if err != nil || out != nil {
			return derefComplete(out), err
		}
		// everything matched but the creation terminal changed under us
		cur, termRev = r, rev
	}
	return authority.CompleteCreationResult{}, authority.Wrap(authority.ErrUnavailable, "completeCreation gave up after repeated contention", errContention)
}

// creationCompletion is one CompleteCreation: its request, the terminal it
// publishes and the keys it reads and writes.
type creationCompletion struct {
	s                       *Store
	req                     *authority.CompleteCreationRequest
	key                     authority.Key
	record                  *authority.TerminalRecord
	rowKey, resKey, termKey string
}

// decide evaluates the contract's checks, in the contract's order, on (row,
// reservation terminal, creation terminal, target liveness) read together
// (liveKey: the owner's liveness key when the Txn read it, else ""); it
// returns the outcome, or the row and the ModRevision of an expired creation
// terminal to overwrite when the completion can apply.
func (c *creationCompletion) decide(resp *clientv3.TxnResponse, liveKey string) (*schema.Row, int64, *authority.CompleteCreationResult, error) {
	s, req := c.s, c.req
	got, now := txnkit.ReadsOf(resp), s.clock.Now()
	var termRev int64
	if kv := got[c.termKey]; kv != nil {
		existing, err := schema.DecodeTerminal(kv)
		if err != nil {
			return nil, 0, nil, err
		}
		if existing.ExpiresAt.After(now) {
			return nil, 0, &authority.CompleteCreationResult{Kind: authority.KindAlreadyCompleted, Terminal: existing}, nil
		}
		termRev = kv.ModRevision
	}
	state, err := s.reservationState(got[c.resKey])
	if err != nil {
		return nil, 0, nil, err
	}
	if state != "" && state != schema.ReservationAborted {
		return nil, 0, &authority.CompleteCreationResult{Kind: authority.KindStale}, nil
	}
	cur, err := s.rowIn(got, c.key)
	if err != nil {
		return nil, 0, nil, err
	}
	if !pendingMatches(cur, req.ReservationID, req.ExpectedStoreVersion, req.Target) ||
		(liveKey != "" && got[liveKey] == nil) {
		return nil, 0, &authority.CompleteCreationResult{Kind: authority.KindStale}, nil
	}
	return cur, termRev, nil, nil
}

// send writes the completion of the reserved row cur over the creation
// terminal at termRev (0: none), with leases for the reservation and
// creation terminals; it returns the outcome when the Txn applied, else the
// failed Txn's response (its Else reads the row, both terminals and the
// owner's liveness).
func (c *creationCompletion) send(ctx context.Context, cur *schema.Row, termRev int64) (*authority.CompleteCreationResult, *clientv3.TxnResponse, error) {
	s, req, record := c.s, c.req, c.record
	liveKey := s.keys.Liveness(cur.Alloc.Descriptor, cur.Alloc.DescriptorLifecycleGeneration, cur.Owner)
	_, resTTL := s.reservationRecord("")
	// the reads took time: the terminal must still be live when the write is
	// built (ValidateTerminalExpiry), not only when validated
	now := s.clock.Now()
	if err := authority.ValidateTerminalExpiry(record.ExpiresAt, now); err != nil {
		return nil, nil, err
	}
	var resp *clientv3.TxnResponse
	var next *schema.Row
	// from storeversion.FewerKeys on no reservation terminal is written:
	// the creation terminal answers a retry, and no other operation tells
	// the terminal of a completed reservation from its absence (a commit
	// of an Actor is refused; an abort is stale either way)
	ttls := []time.Duration{record.ExpiresAt.Sub(now), resTTL}
	if s.atLeast(storeversion.FewerKeys) {
		ttls = ttls[:1]
	}
	err := s.leases.withLeases(ctx, ttls, func(ids []clientv3.LeaseID) error {
		// granting the leases took time too
		if err := authority.ValidateTerminalExpiry(record.ExpiresAt, s.clock.Now()); err != nil {
			return err
		}
		t := &txnkit.Txn{}
		t.Cmp(modRevIs(c.rowKey, cur.ModRev))
		t.Cmp(s.liveCmp(cur.Alloc.Descriptor, cur.Alloc.DescriptorLifecycleGeneration, cur.Owner))
		t.Cmp(modRevIs(c.termKey, termRev))
		state := string(req.Completion.Kind)
		if req.Completion.Kind == authority.TerminalCreated {
			next, state = s.activate(t, cur, req.Completion.ReadyPayload, nil), schema.ReservationCommitted
		} else {
			s.dropReserved(t, cur)
		}
		if len(ids) > 1 { // before FewerKeys
			rec, _ := s.reservationRecord(state)
			t.Put(c.resKey, rec.Encode(), clientv3.WithLease(ids[len(ids)-1]))
		}
		t.Put(c.termKey, schema.EncodeTerminalAt(s.writeFormat(t), record), clientv3.WithLease(ids[0]))
		for _, k := range []string{c.rowKey, c.resKey, c.termKey, liveKey} {
			t.OrGet(k)
		}
		var err error
		resp, err = s.sendWrite(ctx, t, "the creation completion")
		return err
	})
	if err != nil || !resp.Succeeded {
		return nil, resp, err
	}
	out := authority.CompleteCreationResult{Kind: authority.ResultKind(req.Completion.Kind), Terminal: record.Clone()}
	if next != nil {
		next.Written(resp.Header.Revision)
		s.remember(next)
		out.Ready = next.Snapshot(s.clock.Now())
	}
	return &out, nil, nil
}

func derefComplete(r *authority.CompleteCreationResult) authority.CompleteCreationResult {
	if r == nil {
		return authority.CompleteCreationResult{}
	}
	return *r
}

// readCreationTerminal returns the unexpired terminal of an operation. An
// expired one it finds it deletes (dropExpired), as the seed's read does, so
// no later operation of any store sees it again: it answers missing only
// once the terminal is gone.
func (s *Store) readCreationTerminal(ctx context.Context, op authority.CreationOperation) (authority.TerminalReadResult, error) {
	if err := authority.ValidateCreationOperation(op); err != nil {
		return authority.TerminalReadResult{}, err
	}
	if err := s.begin(ctx); err != nil {
		return authority.TerminalReadResult{}, err
	}
	resp, err := s.read(ctx, opGet(s.keys.Terminal(op)))
	if err != nil {
		return authority.TerminalReadResult{}, err
	}
	now := s.clock.Now()
	kv := txnkit.ReadsOf(resp)[s.keys.Terminal(op)]
	if kv == nil {
		return authority.TerminalReadResult{Kind: authority.KindMissing, StoreNow: now}, nil
	}
	rec, err := schema.DecodeTerminal(kv)
	if err != nil {
		return authority.TerminalReadResult{}, err
	}
	if !rec.ExpiresAt.After(now) {
		if err := s.dropExpired(ctx, s.keys.Terminal(op), kv.ModRevision); err != nil {
			return authority.TerminalReadResult{}, err
		}
		return authority.TerminalReadResult{Kind: authority.KindMissing, StoreNow: now}, nil
	}
	return authority.TerminalReadResult{Kind: authority.KindFound, Record: rec}, nil
}
