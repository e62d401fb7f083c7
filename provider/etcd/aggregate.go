package etcd

import (
	"context"
	"maps"
	"slices"
	"time"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/internal/etcdpage"
	"github.com/zlink-systems/authority/internal/observe"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// aggregateOpsPerParticipant is the most operations one participant adds to
// the commit Txn (newOwner: row, two capacity entries, two owner index
// entries); the Txn also writes the record, the aggregate's capacity, the
// target's capacity epoch and the epoch of each node a participant leaves.
const aggregateOpsPerParticipant = 5

// prepareAggregate checks the participants and reserves the target's
// capacity: a read of the record, the rows, the target's liveness (and the
// target's capacity under a policy), then one Txn fenced on all of them.
// An aggregate whose commit could not fit the Txn limits is refused with
// ErrLimitExceeded before anything is written.
func (s *Store) prepareAggregate(ctx context.Context, req authority.AggregatePrepareRequest) (authority.PrepareAggregateResult, error) {
	if err := authority.ValidateAggregatePrepare(req); err != nil {
		return authority.PrepareAggregateResult{}, err
	}
	if err := s.begin(ctx); err != nil {
		return authority.PrepareAggregateResult{}, err
	}
	if err := s.checkAggregateFits(&req, 0); err != nil {
		return authority.PrepareAggregateResult{}, err
	}
	fence := req.Fence()
	aggKey := s.keys.aggregate(fence)
	target := req.TargetAllocation()
	liveKey := s.keys.liveness(req.TargetDescriptor, req.TargetDescriptorLifecycleGeneration, req.TargetOwner)
	conflict := authority.PrepareAggregateResult{Kind: authority.KindConflict}
	fullRange := false
	for attempt := 0; attempt < maxAttempts; attempt++ {
		s.retrying(observe.OpPrepareAggregate, attempt)
		policy := s.capacityPolicy()
		gets := make([]clientv3.Op, len(req.Participants))
		for i, p := range req.Participants {
			gets[i] = opGet(s.keys.row(p.AuthorityKey))
		}
		reads := []clientv3.Op{opGet(aggKey), opGet(liveKey)}
		var ur usageRead
		if policy != nil {
			reads, ur = s.addUsageReads(reads, target.Descriptor, target.DescriptorLifecycleGeneration, fullRange)
		}
		resp, got, err := s.readWithRows(ctx, reads, gets)
		if err != nil {
			return authority.PrepareAggregateResult{}, err
		}
		var expiredRev int64 // an expired record is as good as none
		if kv := got[aggKey]; kv != nil {
			rec, err := decodeAggregate(kv)
			if err != nil {
				return authority.PrepareAggregateResult{}, err
			}
			if s.aggregateLive(rec) {
				switch {
				case rec.State == aggregatePrepared && rec.Request.Equal(&req):
					return authority.PrepareAggregateResult{Kind: authority.KindAlreadyPrepared, Fence: fence}, nil
				case rec.State == aggregateCommitted:
					return authority.PrepareAggregateResult{Kind: authority.KindStale}, nil
				}
				return conflict, nil
			}
			expiredRev = kv.ModRevision
		}
		if got[liveKey] == nil {
			return conflict, nil
		}
		t := &txn{}
		t.cmp(modRevIs(aggKey, expiredRev))
		t.orGet(aggKey) // the record decides first: read it on failure
		t.cmp(s.liveCmp(req.TargetDescriptor, req.TargetDescriptorLifecycleGeneration, req.TargetOwner))
		if policy != nil {
			u, epoch, ok, err := s.usageAt(ctx, resp, ur)
			if err != nil {
				return authority.PrepareAggregateResult{}, err
			}
			if !ok {
				fullRange = true // the watched usage is not that of the read
				continue
			}
			if !fits(policy, target, u) {
				return conflict, nil
			}
			s.fenceCapacity(t, target.Descriptor, target.DescriptorLifecycleGeneration, epoch)
		}
		source := authority.CapacityVector{}
		liveSeen := map[string]bool{}
		left := map[string]bool{} // the capacity epochs of the nodes newOwner participants leave
		for _, p := range req.Participants {
			r, err := s.rowIn(got, p.AuthorityKey)
			if err != nil {
				return authority.PrepareAggregateResult{}, err
			}
			if r == nil || r.alloc.State != authority.AllocationActive || version(r.modRev) != p.ExpectedStoreVersion {
				return conflict, nil
			}
			t.cmp(modRevIs(s.keys.row(p.AuthorityKey), r.modRev))
			if p.OwnerTransition == authority.TransitionPreserve {
				// the owner must be live: fenced in the Txn, read on failure
				lk := s.keys.liveness(r.alloc.Descriptor, r.alloc.DescriptorLifecycleGeneration, r.owner)
				if !liveSeen[lk] {
					liveSeen[lk] = true
					t.cmp(s.rowOwnerLive(r))
					t.orGet(lk, clientv3.WithKeysOnly())
				}
				continue
			}
			if source, err = authority.AddCapacity(source, r.alloc.Capacity); err != nil {
				// two Spot types among the newOwner rows: AddCapacity
				// refuses them; nothing is written
				return authority.PrepareAggregateResult{}, err
			}
			if r.alloc.Descriptor != target.Descriptor || r.alloc.DescriptorLifecycleGeneration != target.DescriptorLifecycleGeneration {
				left[s.keys.capacityEpoch(r.alloc.Descriptor, r.alloc.DescriptorLifecycleGeneration)] = true
			}
		}
		// the commit touches one more epoch per node left: refuse now what
		// it could not send
		if err := s.checkAggregateFits(&req, len(left)); err != nil {
			return authority.PrepareAggregateResult{}, err
		}
		if !source.Equal(req.Capacity) {
			return conflict, nil
		}
		t.put(aggKey, (&aggregateRecord{State: aggregatePrepared, Request: *req.Clone()}).encode())
		reserved := target
		reserved.State = authority.AllocationReserved
		t.put(s.keys.capacityAggregate(reserved, fence), capacityValue(reserved.State, req.Capacity))
		s.touchCapacity(t, reserved)
		tresp, err := s.sendWrite(ctx, t, "the aggregate prepare")
		if err != nil {
			return authority.PrepareAggregateResult{}, err
		}
		if tresp.Succeeded {
			s.aggs.put(aggKey, knownAggregate{&aggregateRecord{State: aggregatePrepared, Request: *req.Clone()}, tresp.Header.Revision}, true)
			return authority.PrepareAggregateResult{Kind: authority.KindPrepared, Fence: fence}, nil
		}
		failed := readsOf(tresp)
		if recordRev(failed[aggKey]) != expiredRev {
			// the record was written (or its expired one removed) since
			// the read: it decides before any liveness, as the contract reads
			// it first
			continue
		}
		for lk := range liveSeen {
			if failed[lk] == nil {
				return conflict, nil // a preserve participant's owner is not live
			}
		}
		// a row, the record, the target's liveness or its capacity changed
		// since the read: evaluate again.
	}
	return authority.PrepareAggregateResult{}, authority.Wrap(authority.ErrUnavailable, "prepareAggregate gave up after repeated contention", errContention)
}

// recordRev is the ModRevision of a read record kv (0: none).
func recordRev(kv *mvccpbKV) int64 {
	if kv == nil {
		return 0
	}
	return kv.ModRevision
}

// readWithRows reads first and the single-row gets in one Txn and returns
// the response and everything read, by key; when the rows together pass the
// client's receive limit it reads them apart, in parts (readInParts: each
// row is then fenced on its own ModRevision, so they need not share the
// revision of first).
func (s *Store) readWithRows(ctx context.Context, first, gets []clientv3.Op) (*clientv3.TxnResponse, keyedReads, error) {
	resp, err := s.read(ctx, append(slices.Clip(first), gets...)...)
	if err == nil {
		return resp, readsOf(resp), nil
	}
	if !etcdpage.TooLarge(err) {
		return nil, nil, err
	}
	if resp, err = s.read(ctx, first...); err != nil {
		return nil, nil, err
	}
	rows, err := s.readInParts(ctx, gets)
	if err != nil {
		return nil, nil, err
	}
	got := readsOf(resp)
	maps.Copy(got, rows)
	return resp, got, nil
}

// checkAggregateFits refuses an aggregate whose prepare or commit Txn
// cannot fit the configured limits, when its newOwner participants leave
// sourceNodes node lifecycles (each a capacity epoch the commit touches).
func (s *Store) checkAggregateFits(req *authority.AggregatePrepareRequest, sourceNodes int) error {
	n := len(req.Participants)
	commit := &txn{bytes: 4096}
	prepare := &txn{bytes: 4096}
	for i := 0; i < n; i++ {
		p := req.Participants[i]
		size := len(s.keys.row(p.AuthorityKey)) + len(p.AuthorityPayload) + 512
		commit.bytes += size + 4*(len(s.keys.ns)+len(p.AuthorityKey)+200)
		prepare.bytes += size + len(p.MembershipMutation)
	}
	// both Txns put the aggregate record, which repeats every payload and
	// membership mutation: its size comes from the record's own encoder
	fence := authority.Fence{AggregateID: req.AggregateID, AggregateGeneration: req.AggregateGeneration}
	finished := &aggregateRecord{State: aggregateCommitted, Request: *req, ExpiresAt: s.clock.Now().Add(s.retention)}
	record := len(s.keys.aggregate(fence)) + len(finished.encode()) + opOverhead
	commit.bytes += record
	prepare.bytes += record
	// compares: a row and at most one owner liveness per participant, the
	// record and the target's liveness; ops: see aggregateOpsPerParticipant.
	commitOps := max(2*n+2, aggregateOpsPerParticipant*n+3+sourceNodes)
	prepareOps := 2*n + 3
	for _, c := range []struct {
		t   *txn
		ops int
	}{{commit, commitOps}, {prepare, prepareOps}} {
		if c.ops > s.maxOps {
			return limitError(flagMaxTxnOps, "an aggregate of "+itoa(int64(n))+" participants needs up to "+itoa(int64(c.ops))+
				" operations in one transaction, more than "+itoa(int64(s.maxOps))+"; it", nil)
		}
		if c.t.bytes > s.maxBytes {
			return limitError(flagMaxRequestBytes, "the aggregate needs a request of about "+itoa(int64(c.t.bytes))+
				" bytes, more than "+itoa(int64(s.maxBytes))+"; it", nil)
		}
	}
	return nil
}

// loadAggregate returns the record of fence and its ModRevision (nil when
// there is none): the state this store last wrote or saw when it knows one
// that has not expired (see knownAggregate; known is then true), else read.
// An expired record is read again: once it expires another store may
// prepare the same fence anew.
func (s *Store) loadAggregate(ctx context.Context, fence authority.Fence) (rec *aggregateRecord, rev int64, known bool, err error) {
	aggKey := s.keys.aggregate(fence)
	if k, ok := s.aggs.get(aggKey); ok && s.aggregateLive(k.rec) {
		return k.rec, k.rev, true, nil
	}
	rec, rev, err = s.readAggregate(ctx, aggKey)
	return rec, rev, false, err
}

// readAggregate reads the record at aggKey.
func (s *Store) readAggregate(ctx context.Context, aggKey string) (*aggregateRecord, int64, error) {
	resp, err := s.read(ctx, opGet(aggKey))
	if err != nil {
		return nil, 0, err
	}
	return s.seenAggregate(aggKey, readsOf(resp)[aggKey])
}

// seenAggregate decodes a read record kv (nil: none) and remembers it.
func (s *Store) seenAggregate(aggKey string, kv *mvccpbKV) (*aggregateRecord, int64, error) {
	if kv == nil {
		return nil, 0, nil
	}
	rec, err := decodeAggregate(kv)
	if err != nil {
		return nil, 0, err
	}
	s.aggs.put(aggKey, knownAggregate{rec, kv.ModRevision}, true)
	if !s.aggregateLive(rec) {
		return nil, kv.ModRevision, nil
	}
	return rec, kv.ModRevision, nil
}

// aggregateLive reports whether rec has not expired (a prepared record
// never does).
func (s *Store) aggregateLive(rec *aggregateRecord) bool {
	return rec.ExpiresAt.IsZero() || rec.ExpiresAt.After(s.clock.Now())
}

// finished returns the committed or aborted successor of rec, which
// expires after the store's retention, and that retention.
func (s *Store) finished(rec *aggregateRecord, state string) (*aggregateRecord, time.Duration) {
	return &aggregateRecord{State: state, Request: rec.Request, ExpiresAt: s.clock.Now().Add(s.retention)}, s.retention
}

// sendFinished sends t plus the put of the finished record done at aggKey
// on a lease that outlives it, and the read of aggKey in the Else (its
// first).
func (s *Store) sendFinished(ctx context.Context, t *txn, aggKey string, done *aggregateRecord, ttl time.Duration, what string) (*clientv3.TxnResponse, error) {
	var resp *clientv3.TxnResponse
	err := s.leases.withLeases(ctx, []time.Duration{ttl}, func(ids []clientv3.LeaseID) error {
		tt := t.clone()
		tt.put(aggKey, done.encode(), clientv3.WithLease(ids[0]))
		tt.orGet(aggKey)
		var err error
		resp, err = s.sendWrite(ctx, tt, what)
		return err
	})
	return resp, err
}

// commitPrepared applies every participant or none, in one Txn fenced on
// the record, every row's version and the owners' liveness.
func (s *Store) commitPrepared(ctx context.Context, fence authority.Fence) (authority.CommitAggregateResult, error) {
	if err := authority.ValidateFence(fence); err != nil {
		return authority.CommitAggregateResult{}, err
	}
	if err := s.begin(ctx); err != nil {
		return authority.CommitAggregateResult{}, err
	}
	aggKey := s.keys.aggregate(fence)
	rec, rev, known, err := s.loadAggregate(ctx, fence)
	if err != nil {
		return authority.CommitAggregateResult{}, err
	}
	return s.commitAggregate(ctx, aggKey, rec, rev, known)
}

// commitAggregate commits the record rec at rev (nil: none); known says it
// is the store's memory of the record rather than a read.
func (s *Store) commitAggregate(ctx context.Context, aggKey string, rec *aggregateRecord, rev int64, known bool) (authority.CommitAggregateResult, error) {
	stale := authority.CommitAggregateResult{Kind: authority.KindStale}
	if rec == nil {
		return stale, nil
	}
	switch rec.State {
	case aggregateCommitted:
		return authority.CommitAggregateResult{Kind: authority.KindAlreadyCommitted}, nil
	case aggregatePrepared:
	default:
		return stale, nil
	}
	req := &rec.Request
	// the participants' rows at their expected versions, from the cache or
	// one read
	rows := make([]*row, len(req.Participants))
	var missing []int
	for i, p := range req.Participants {
		if rows[i] = s.cachedRow(p.AuthorityKey, p.ExpectedStoreVersion); rows[i] == nil {
			missing = append(missing, i)
		}
	}
	if len(missing) > 0 {
		ops := make([]clientv3.Op, len(missing), len(missing)+1)
		for j, i := range missing {
			ops[j] = opGet(s.keys.row(req.Participants[i].AuthorityKey))
		}
		if known {
			// the rows are read anyway: read the record with them, since
			// another store may have committed or aborted it (the rows would
			// then no longer match, and the answer is the record's)
			ops = append(ops, opGet(aggKey))
		}
		rresp, err := s.read(ctx, ops...)
		if err != nil {
			return authority.CommitAggregateResult{}, err
		}
		got := readsOf(rresp)
		if known {
			fresh, freshRev, err := s.seenAggregate(aggKey, got[aggKey])
			if err != nil {
				return authority.CommitAggregateResult{}, err
			}
			if freshRev != rev {
				return s.commitAggregate(ctx, aggKey, fresh, freshRev, false)
			}
		}
		for _, i := range missing {
			if rows[i], err = s.rowIn(got, req.Participants[i].AuthorityKey); err != nil {
				return authority.CommitAggregateResult{}, err
			}
		}
	}
	t := &txn{}
	t.cmp(modRevIs(aggKey, rev))
	liveSeen := map[string]bool{}
	live := func(node authority.NodeDescriptor, lifecycle int64, owner authority.OwnerToken) {
		if k := s.keys.liveness(node, lifecycle, owner); !liveSeen[k] {
			liveSeen[k] = true
			t.cmp(s.liveCmp(node, lifecycle, owner))
		}
	}
	next := make([]*row, len(rows))
	for i, p := range req.Participants {
		r := rows[i]
		if r == nil || r.alloc.State != authority.AllocationActive || version(r.modRev) != p.ExpectedStoreVersion {
			return stale, nil
		}
		rowKey := s.keys.row(p.AuthorityKey)
		t.cmp(modRevIs(rowKey, r.modRev))
		n := r.next(0)
		n.payload = append([]byte(nil), p.AuthorityPayload...)
		next[i] = n
		if p.OwnerTransition != authority.TransitionNewOwner {
			live(r.alloc.Descriptor, r.alloc.DescriptorLifecycleGeneration, r.owner)
			t.put(rowKey, n.encode(false))
			continue
		}
		live(req.TargetDescriptor, req.TargetDescriptorLifecycleGeneration, req.TargetOwner)
		n.owner = req.TargetOwner
		n.alloc = r.alloc.Clone()
		n.alloc.Descriptor = req.TargetDescriptor
		n.alloc.DescriptorLifecycleGeneration = req.TargetDescriptorLifecycleGeneration
		n.ownerGen = 0 // resolved to this write's revision
		t.put(rowKey, n.encode(true))
		if oldCap, newCap := s.keys.capacityRow(r.alloc, r.key), s.keys.capacityRow(n.alloc, r.key); oldCap != newCap {
			t.del(oldCap)
			t.put(newCap, capacityValue(n.alloc.State, n.alloc.Capacity))
			s.touchCapacity(t, r.alloc)
			s.touchCapacity(t, n.alloc)
		}
		if oldIdx, newIdx := s.keys.ownerRow(r.owner, r.key), s.keys.ownerRow(n.owner, r.key); oldIdx != newIdx {
			t.del(oldIdx)
			t.put(newIdx, "")
		}
	}
	done, ttl := s.finished(rec, aggregateCommitted)
	reserved := req.TargetAllocation()
	reserved.State = authority.AllocationReserved
	t.del(s.keys.capacityAggregate(reserved, req.Fence()))
	s.touchCapacity(t, reserved)
	tresp, err := s.sendFinished(ctx, t, aggKey, done, ttl, "the aggregate commit")
	if err != nil {
		return authority.CommitAggregateResult{}, err
	}
	if !tresp.Succeeded {
		// the record now in etcd decides, not the one this store remembered
		// (another store may have aborted it and prepared the fence anew)
		fresh, freshRev, err := s.seenAggregate(aggKey, readsOf(tresp)[aggKey])
		switch {
		case err != nil:
			return authority.CommitAggregateResult{}, err
		case fresh != nil && fresh.State == aggregateCommitted:
			return authority.CommitAggregateResult{Kind: authority.KindAlreadyCommitted}, nil
		case known && fresh != nil && freshRev != rev:
			return s.commitAggregate(ctx, aggKey, fresh, freshRev, false)
		}
		return stale, nil
	}
	s.aggs.put(aggKey, knownAggregate{done, tresp.Header.Revision}, true)
	for _, n := range next {
		n.modRev = tresp.Header.Revision
		if n.ownerGen == 0 {
			n.ownerGen = tresp.Header.Revision
		}
		s.remember(n)
	}
	return authority.CommitAggregateResult{Kind: authority.KindCommitted}, nil
}

// abortPrepared releases a prepared aggregate's capacity.
func (s *Store) abortPrepared(ctx context.Context, fence authority.Fence) (authority.AbortAggregateResult, error) {
	if err := authority.ValidateFence(fence); err != nil {
		return authority.AbortAggregateResult{}, err
	}
	if err := s.begin(ctx); err != nil {
		return authority.AbortAggregateResult{}, err
	}
	rec, rev, known, err := s.loadAggregate(ctx, fence)
	if err != nil {
		return authority.AbortAggregateResult{}, err
	}
	return s.abortAggregate(ctx, fence, rec, rev, known)
}

// abortAggregate aborts the record rec at rev (nil: none); known says it is
// the store's memory of the record rather than a read.
func (s *Store) abortAggregate(ctx context.Context, fence authority.Fence, rec *aggregateRecord, rev int64, known bool) (authority.AbortAggregateResult, error) {
	stale := authority.AbortAggregateResult{Kind: authority.KindStale}
	if rec == nil {
		return stale, nil
	}
	switch rec.State {
	case aggregateAborted:
		return authority.AbortAggregateResult{Kind: authority.KindAlreadyAborted}, nil
	case aggregatePrepared:
	default:
		return stale, nil
	}
	aggKey := s.keys.aggregate(fence)
	t := &txn{}
	t.cmp(modRevIs(aggKey, rev))
	aborted, ttl := s.finished(rec, aggregateAborted)
	reserved := rec.Request.TargetAllocation()
	reserved.State = authority.AllocationReserved
	t.del(s.keys.capacityAggregate(reserved, fence))
	s.touchCapacity(t, reserved)
	resp, err := s.sendFinished(ctx, t, aggKey, aborted, ttl, "the aggregate abort")
	if err != nil {
		return authority.AbortAggregateResult{}, err
	}
	if resp.Succeeded {
		s.aggs.put(aggKey, knownAggregate{aborted, resp.Header.Revision}, true)
		return authority.AbortAggregateResult{Kind: authority.KindAborted}, nil
	}
	cur, curRev, err := s.seenAggregate(aggKey, readsOf(resp)[aggKey])
	switch {
	case err != nil:
		return authority.AbortAggregateResult{}, err
	case cur != nil && cur.State == aggregateAborted:
		return authority.AbortAggregateResult{Kind: authority.KindAlreadyAborted}, nil
	case known && cur != nil && curRev != rev:
		// the record now in etcd decides, not the remembered one
		return s.abortAggregate(ctx, fence, cur, curRev, false)
	}
	return stale, nil
}
