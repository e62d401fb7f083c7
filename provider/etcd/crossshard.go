package etcd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"

	authority "github.com/zlink-systems/authority"

	"github.com/zlink-systems/authority/provider/etcd/internal/txnkit"
	"github.com/zlink-systems/authority/provider/etcd/schema"
)

// CrossShard is a store's side of aggregates whose participants live in
// several stores, one per etcd cluster (shard): the record in the
// coordinator shard (this file) and the row locks in the participant shards
// (crossshard_part.go). Package provider/sharded/twophase drives it; the
// protocol and its fencing argument are in docs/scale.md, "Aggregates across
// shards". Every write it makes needs the namespace at
// storeversion.RowLocks (ErrNotFinalized otherwise, nothing written).
type CrossShard struct{ s *Store }

// CrossShard returns the store's cross-shard side.
func (s *Store) CrossShard() CrossShard { return CrossShard{s} }

// CrossRecord is a cross-shard aggregate's record as read from (or written
// to) its coordinator shard.
type CrossRecord struct {
	// Request is the request that prepared it, payloads included until it
	// is finished.
	Request authority.AggregatePrepareRequest
	// State is schema.AggregatePrepared, AggregateCommitted or
	// AggregateAborted.
	State string
	// Incarnation is the record's random ID, named by its row locks; empty
	// for the record of an aggregate of one shard.
	Incarnation string
	// Finished says a decided record was applied (committed) or released
	// (aborted) in every shard: it then expires and keeps no payloads.
	Finished bool
	// Revision is the record's ModRevision: a commit attempt may decide
	// only while the record is still at the revision it started from.
	Revision int64
}

// Fence returns the record's fence.
func (r *CrossRecord) Fence() authority.Fence { return r.Request.Fence() }

// crossRecord converts a stored record read or written at rev.
func crossRecord(rec *schema.AggregateRecord, rev int64) *CrossRecord {
	return &CrossRecord{Request: rec.Request, State: rec.State, Incarnation: rec.Incarnation,
		Finished: !rec.ExpiresAt.IsZero(), Revision: rev}
}

// stored is r's stored form.
func (r *CrossRecord) stored() *schema.AggregateRecord {
	return &schema.AggregateRecord{State: r.State, Request: r.Request, Incarnation: r.Incarnation}
}

// ParticipantCheck is what a participant's own shard read of it for a
// cross-shard prepare (CheckParticipants).
type ParticipantCheck struct {
	// Key is the participant's key.
	Key authority.Key
	// Row is the row (nil: missing).
	Row *authority.Snapshot
	// OwnerLive says the row's owner was live on the row's node lifecycle
	// in that shard.
	OwnerLive bool
}

// matches reports whether c passes the contract's prepare checks of part:
// the row is active at the expected version, and a preserve participant's
// owner is live.
func (c *ParticipantCheck) matches(part authority.AggregateParticipant) bool {
	if c.Row == nil || c.Row.Allocation.State != authority.AllocationActive || c.Row.StoreVersion != part.ExpectedStoreVersion {
		return false
	}
	return part.OwnerTransition != authority.TransitionPreserve || c.OwnerLive
}

// crossShardOnly refuses to commit or abort a prepared cross-shard record
// with the operations of one store: its rows are in other stores.
func crossShardOnly(rec *schema.AggregateRecord) error {
	if rec.Incarnation == "" {
		return nil
	}
	return authority.Invalid(fmt.Sprintf("aggregate %s/%d was prepared across shards: commit or abort it through the sharded store (package provider/sharded/twophase)",
		rec.Request.AggregateID, rec.Request.AggregateGeneration))
}

// PrepareCrossShard prepares req in this store, its coordinator shard: the
// record (with a new incarnation) and the target's reserved capacity, in one
// Txn fenced as PrepareAggregate's on the target's liveness and capacity and
// on the participants of this shard; the participants of other shards are
// judged from foreign, their shards' CheckParticipants. The answers are
// PrepareAggregate's.
func (c CrossShard) PrepareCrossShard(ctx context.Context, req authority.AggregatePrepareRequest, foreign []ParticipantCheck) (authority.PrepareAggregateResult, error) {
	s := c.s
	if err := authority.ValidateAggregatePrepare(req); err != nil {
		return authority.PrepareAggregateResult{}, err
	}
	if err := s.refuseWrite(); err != nil {
		return authority.PrepareAggregateResult{}, err
	}
	if err := s.begin(ctx); err != nil {
		return authority.PrepareAggregateResult{}, err
	}
	byKey, err := foreignChecks(&req, foreign)
	if err != nil {
		return authority.PrepareAggregateResult{}, err
	}
	if err := s.rowLocksFence(&txnkit.Txn{}, "a cross-shard aggregate"); err != nil {
		return authority.PrepareAggregateResult{}, err
	}
	if err := s.checkAggregateFits(&req, 0); err != nil {
		return authority.PrepareAggregateResult{}, err
	}
	p := &aggregatePrepare{s: s, req: &req, fence: req.Fence(), target: req.TargetAllocation(), foreign: byKey, inc: randomID(),
		liveKey: s.keys.Liveness(req.TargetDescriptor, req.TargetDescriptorLifecycleGeneration, req.TargetOwner)}
	p.aggKey = s.keys.Aggregate(p.fence)
	for attempt := 0; attempt < maxAttempts; attempt++ {
		out, err := p.attempt(ctx)
		if err != nil || out != nil {
			return derefPrepare(out), err
		}
	}
	return authority.PrepareAggregateResult{}, authority.Wrap(authority.ErrUnavailable, "prepareAggregate gave up after repeated contention", errContention)
}

// foreignChecks indexes foreign by key: each must be a participant of req,
// at most once.
func foreignChecks(req *authority.AggregatePrepareRequest, foreign []ParticipantCheck) (map[authority.Key]*ParticipantCheck, error) {
	byKey := make(map[authority.Key]*ParticipantCheck, len(foreign))
	for i := range foreign {
		f := &foreign[i]
		if byKey[f.Key] != nil || !hasParticipant(req, f.Key) {
			return nil, authority.Invalid(fmt.Sprintf("foreign participant check of %q: not a participant of aggregate %s, or checked twice", f.Key, req.AggregateID))
		}
		byKey[f.Key] = f
	}
	return byKey, nil
}

func hasParticipant(req *authority.AggregatePrepareRequest, key authority.Key) bool {
	for _, p := range req.Participants {
		if p.AuthorityKey == key {
			return true
		}
	}
	return false
}

// ReadRecord reads the record of fence in this store: nil when there is
// none or it expired. A record of one store has no Incarnation.
func (c CrossShard) ReadRecord(ctx context.Context, fence authority.Fence) (*CrossRecord, error) {
	s := c.s
	if err := authority.ValidateFence(fence); err != nil {
		return nil, err
	}
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	rec, rev, err := s.readAggregate(ctx, s.keys.Aggregate(fence))
	if err != nil || rec == nil {
		return nil, err
	}
	return crossRecord(rec, rev), nil
}

// TakeOver rewrites the prepared record rec unchanged if it is still at
// its revision, so that every commit attempt started from that revision
// can no longer decide (their row locks are then left over: anyone may
// release them). It returns the record now and whether this call rewrote
// it; a record that was not current is returned as the store holds it
// (nil: none).
func (c CrossShard) TakeOver(ctx context.Context, rec *CrossRecord) (*CrossRecord, bool, error) {
	if err := c.checkRecord(rec, schema.AggregatePrepared, false); err != nil {
		return nil, false, err
	}
	t := &txnkit.Txn{}
	next := *rec
	return c.rewrite(ctx, t, rec, &next, "taking over a cross-shard aggregate")
}

// Decide moves the prepared record rec to committed (commit) or aborted,
// if it is still at its revision: the single decision point of the
// aggregate. An abort releases the target's reserved capacity in the same
// Txn; a commit keeps it until Finish, after every shard applied its part.
// It returns the record now and whether this call decided it; a record
// that was not current is returned as the store holds it (nil: none).
func (c CrossShard) Decide(ctx context.Context, rec *CrossRecord, commit bool) (*CrossRecord, bool, error) {
	if err := c.checkRecord(rec, schema.AggregatePrepared, false); err != nil {
		return nil, false, err
	}
	t := &txnkit.Txn{}
	next := *rec
	next.State = schema.AggregateCommitted
	if !commit {
		next.State = schema.AggregateAborted
		c.s.releaseReserved(t, &rec.Request)
	}
	return c.rewrite(ctx, t, rec, &next, "deciding a cross-shard aggregate")
}

// releaseReserved adds to t the release of the target capacity req
// reserved.
func (s *Store) releaseReserved(t *txnkit.Txn, req *authority.AggregatePrepareRequest) {
	reserved := req.TargetAllocation()
	reserved.State = authority.AllocationReserved
	t.Del(s.keys.CapacityAggregate(reserved, req.Fence()))
	s.touchCapacity(t, reserved)
}

// Finish finishes the decided record rec once every shard applied
// (committed) or released (aborted) its part: the record keeps no payloads
// and expires after the store's retention, and a commit's reserved target
// capacity is released (the rows' own entries hold it now). It returns the
// record now.
func (c CrossShard) Finish(ctx context.Context, rec *CrossRecord) (*CrossRecord, error) {
	s := c.s
	if err := c.checkRecord(rec, "", true); err != nil {
		return nil, err
	}
	if rec.Finished {
		return rec, nil
	}
	aggKey := s.keys.Aggregate(rec.Fence())
	t := &txnkit.Txn{}
	t.Cmp(modRevIs(aggKey, rec.Revision))
	if rec.State == schema.AggregateCommitted {
		s.releaseReserved(t, &rec.Request)
	}
	done, ttl := s.finished(rec.stored(), rec.State)
	done.Incarnation = rec.Incarnation
	resp, err := s.sendFinished(ctx, t, aggKey, done, ttl, "finishing a cross-shard aggregate")
	if err != nil {
		return nil, err
	}
	if resp.Succeeded {
		s.aggs.Put(aggKey, knownAggregate{done, resp.Header.Revision}, true)
		return crossRecord(done, resp.Header.Revision), nil
	}
	return c.recordIn(aggKey, txnkit.ReadsOf(resp))
}

// checkRecord checks rec before a write: a cross-shard record in state
// (any decided state when decided), on a store that may write it.
func (c CrossShard) checkRecord(rec *CrossRecord, state string, decided bool) error {
	s := c.s
	if rec == nil || rec.Incarnation == "" {
		return authority.Invalid("a cross-shard aggregate operation needs a cross-shard record (one with an incarnation)")
	}
	if err := authority.ValidateFence(rec.Fence()); err != nil {
		return err
	}
	if decided && rec.State == schema.AggregatePrepared || !decided && rec.State != state {
		return authority.Invalid(fmt.Sprintf("aggregate %s/%d is %s", rec.Request.AggregateID, rec.Request.AggregateGeneration, rec.State))
	}
	return s.refuseWrite()
}

// rewrite puts next at rec's key if the record is still at rec's revision,
// with t's other writes, and returns the record now and whether it wrote
// it.
func (c CrossShard) rewrite(ctx context.Context, t *txnkit.Txn, rec, next *CrossRecord, what string) (*CrossRecord, bool, error) {
	s := c.s
	if err := s.begin(ctx); err != nil {
		return nil, false, err
	}
	if err := s.rowLocksFence(t, "a cross-shard aggregate"); err != nil {
		return nil, false, err
	}
	aggKey := s.keys.Aggregate(rec.Fence())
	stored := next.stored()
	t.Cmp(modRevIs(aggKey, rec.Revision))
	t.Put(aggKey, stored.Encode())
	t.OrGet(aggKey)
	resp, err := s.sendRaw(ctx, t, what)
	if err != nil {
		return nil, false, err
	}
	if resp.Succeeded {
		s.aggs.Put(aggKey, knownAggregate{stored, resp.Header.Revision}, true)
		return crossRecord(stored, resp.Header.Revision), true, nil
	}
	cur, err := c.recordIn(aggKey, txnkit.ReadsOf(resp))
	return cur, false, err
}

// recordIn decodes the record at aggKey from a failed Txn's reads (nil:
// none, or expired).
func (c CrossShard) recordIn(aggKey string, got txnkit.Reads) (*CrossRecord, error) {
	rec, rev, err := c.s.seenAggregate(aggKey, got[aggKey])
	if err != nil || rec == nil {
		return nil, err
	}
	return crossRecord(rec, rev), nil
}

// randomID returns a new incarnation or attempt ID: 128 random bits in
// lowercase hex.
func randomID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}
