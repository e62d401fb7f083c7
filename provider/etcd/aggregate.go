package etcd

import (
	"context"
	"maps"
	"slices"
	"time"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/internal/etcdpage"
	"github.com/zlink-systems/authority/internal/observe"
	"github.com/zlink-systems/authority/provider/etcd/internal/txnkit"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/etcd/storeversion"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// aggregateOpsPerParticipant is the most operations one participant adds to
// the commit Txn (newOwner: row, two capacity entries, two owner index
// entries; or, from storeversion.FewerKeys on, row, two placement keys and
// at most one owner index entry deleted); the Txn also writes the record,
// the aggregate's capacity, the target's capacity epoch and owner directory
// key (FewerKeys), and the epoch of each node a participant leaves.
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
	p := &aggregatePrepare{s: s, req: &req, fence: req.Fence(), target: req.TargetAllocation(),
		liveKey: s.keys.Liveness(req.TargetDescriptor, req.TargetDescriptorLifecycleGeneration, req.TargetOwner)}
	p.aggKey = s.keys.Aggregate(p.fence)
	for attempt := 0; attempt < maxAttempts; attempt++ {
		s.retrying(observe.OpPrepareAggregate, attempt)
		out, err := p.attempt(ctx)
		if err != nil || out != nil {
			return derefPrepare(out), err
		}
	}
	return authority.PrepareAggregateResult{}, authority.Wrap(authority.ErrUnavailable, "prepareAggregate gave up after repeated contention", errContention)
}

func derefPrepare(r *authority.PrepareAggregateResult) authority.PrepareAggregateResult {
	if r == nil {
		return authority.PrepareAggregateResult{}
	}
	return *r
}

// aggregatePrepare is one PrepareAggregate: its request and what its
// attempts share.
type aggregatePrepare struct {
	s               *Store
	req             *authority.AggregatePrepareRequest
	fence           authority.Fence
	target          authority.PlacementAllocation
	aggKey, liveKey string
	fullRange       bool // read the target's capacity range, watched or not
	// a cross-shard prepare (crossshard.go): the participants other shards
	// checked, and the record's incarnation ("" for a prepare of one store)
	foreign map[authority.Key]*ParticipantCheck
	inc     string
}

// record is the prepared record p writes.
func (p *aggregatePrepare) record() *schema.AggregateRecord {
	return &schema.AggregateRecord{State: schema.AggregatePrepared, Request: *p.req.Clone(), Incarnation: p.inc}
}

// preparedTxn is an attempt's Txn and what its failure is judged by.
type preparedTxn struct {
	t          *txnkit.Txn
	expiredRev int64           // the expired record it replaces (0: none)
	liveSeen   map[string]bool // the preserve participants' owners' liveness keys
}

func (p *aggregatePrepare) conflict() *authority.PrepareAggregateResult {
	return &authority.PrepareAggregateResult{Kind: authority.KindConflict}
}

// attempt reads, decides and sends once; a nil result and error means
// "evaluate again".
func (p *aggregatePrepare) attempt(ctx context.Context) (*authority.PrepareAggregateResult, error) {
	s := p.s
	policy := s.capacityPolicy()
	gets := make([]clientv3.Op, 0, len(p.req.Participants))
	for _, part := range p.req.Participants {
		if p.foreign[part.AuthorityKey] == nil {
			gets = append(gets, opGet(s.keys.Row(part.AuthorityKey)))
		}
	}
	first := []clientv3.Op{opGet(p.aggKey), opGet(p.liveKey)}
	var ur usageRead
	if policy != nil || s.escrow != nil {
		first, ur = s.addUsageReads(first, p.target.Descriptor, p.target.DescriptorLifecycleGeneration, p.fullRange)
	}
	resp, got, err := s.readWithRows(ctx, first, gets)
	if err != nil {
		return nil, err
	}
	pt := preparedTxn{t: &txnkit.Txn{}, liveSeen: map[string]bool{}}
	if out, err := p.recordDecides(got, &pt); err != nil || out != nil {
		return out, err
	}
	if got[p.liveKey] == nil {
		return p.conflict(), nil
	}
	pt.t.Cmp(modRevIs(p.aggKey, pt.expiredRev))
	pt.t.OrGet(p.aggKey) // the record decides first: read it on failure
	pt.t.Cmp(s.liveCmp(p.req.TargetDescriptor, p.req.TargetDescriptorLifecycleGeneration, p.req.TargetOwner))
	if policy != nil || s.escrow != nil {
		u, epoch, ok, err := s.usageAt(ctx, resp, ur)
		if err != nil || !ok {
			p.fullRange = err == nil // the watched usage is not that of the read
			return nil, err
		}
		held := p.held(got)
		if !fits(policy, held, u) {
			return p.conflict(), nil
		}
		sl, err := s.sliceAt(resp, ur)
		if err != nil {
			return nil, err
		}
		if !sl.holds(held, u) {
			return p.growForPrepare(ctx, held.Capacity) // escrow mode: the slice is short
		}
		s.fenceCapacity(pt.t, p.target.Descriptor, p.target.DescriptorLifecycleGeneration, epoch)
		sl.fence(pt.t)
	}
	if out, err := p.addParticipants(got, &pt); err != nil || out != nil {
		return out, err
	}
	return p.send(ctx, pt)
}

// held is the target capacity the prepare reserves in this store: the
// request's, or for a cross-shard prepare the part its commit moves into
// this store (the capacity of the newOwner participants whose rows are
// here, as read in got; crossshard_capacity.go), the other shards reserving
// theirs.
func (p *aggregatePrepare) held(got txnkit.Reads) authority.PlacementAllocation {
	if p.inc == "" {
		return p.target
	}
	held := p.target
	held.Capacity = authority.CapacityVector{}
	for _, part := range p.req.Participants {
		if p.foreign[part.AuthorityKey] != nil || part.OwnerTransition != authority.TransitionNewOwner {
			continue
		}
		// a row not as expected makes the prepare a conflict
		// (addParticipants); two Spot types an error
		if r, err := p.s.rowIn(got, part.AuthorityKey); err == nil && r != nil {
			if c, err := authority.AddCapacity(held.Capacity, r.Alloc.Capacity); err == nil {
				held.Capacity = c
			}
		}
	}
	return held
}

// recordDecides answers from a live record already at the fence, or notes
// the expired one the prepare replaces.
func (p *aggregatePrepare) recordDecides(got txnkit.Reads, pt *preparedTxn) (*authority.PrepareAggregateResult, error) {
	kv := got[p.aggKey]
	if kv == nil {
		return nil, nil
	}
	rec, err := schema.DecodeAggregate(kv)
	if err != nil {
		return nil, err
	}
	if !p.s.aggregateLive(rec) {
		pt.expiredRev = kv.ModRevision // an expired record is as good as none
		return nil, nil
	}
	switch {
	case rec.State == schema.AggregatePrepared && rec.Request.Equal(p.req):
		return &authority.PrepareAggregateResult{Kind: authority.KindAlreadyPrepared, Fence: p.fence}, nil
	case rec.State == schema.AggregateCommitted:
		return &authority.PrepareAggregateResult{Kind: authority.KindStale}, nil
	}
	return p.conflict(), nil
}

// addParticipants fences every participant's row (and a preserve
// participant's owner's liveness) and writes the prepared record and the
// target's reserved capacity.
func (p *aggregatePrepare) addParticipants(got txnkit.Reads, pt *preparedTxn) (*authority.PrepareAggregateResult, error) {
	s, t := p.s, pt.t
	source := authority.CapacityVector{}
	var err error
	left := map[string]bool{} // the capacity epochs of the nodes newOwner participants leave
	for _, part := range p.req.Participants {
		if f := p.foreign[part.AuthorityKey]; f != nil {
			// checked in its own shard (its own read, not fenced here)
			if !f.matches(part) {
				return p.conflict(), nil
			}
			if part.OwnerTransition == authority.TransitionNewOwner {
				if source, err = authority.AddCapacity(source, f.Row.Allocation.Capacity); err != nil {
					return nil, err
				}
			}
			continue
		}
		r, err := s.rowIn(got, part.AuthorityKey)
		if err != nil {
			return nil, err
		}
		if r == nil || r.Alloc.State != authority.AllocationActive || r.Version() != part.ExpectedStoreVersion {
			return p.conflict(), nil
		}
		t.Cmp(modRevIs(s.keys.Row(part.AuthorityKey), r.ModRev))
		if part.OwnerTransition == authority.TransitionPreserve {
			// the owner must be live: fenced in the Txn, read on failure
			lk := s.keys.Liveness(r.Alloc.Descriptor, r.Alloc.DescriptorLifecycleGeneration, r.Owner)
			if !pt.liveSeen[lk] {
				pt.liveSeen[lk] = true
				t.Cmp(s.rowOwnerLive(r))
				t.OrGet(lk, clientv3.WithKeysOnly())
			}
			continue
		}
		if source, err = authority.AddCapacity(source, r.Alloc.Capacity); err != nil {
			// two Spot types among the newOwner rows: AddCapacity refuses
			// them; nothing is written
			return nil, err
		}
		if r.Alloc.Descriptor != p.target.Descriptor || r.Alloc.DescriptorLifecycleGeneration != p.target.DescriptorLifecycleGeneration {
			left[s.keys.CapacityEpoch(r.Alloc.Descriptor, r.Alloc.DescriptorLifecycleGeneration)] = true
		}
	}
	// the commit touches one more epoch per node left: refuse now what it
	// could not send
	if err := s.checkAggregateFits(p.req, len(left)); err != nil {
		return nil, err
	}
	if !source.Equal(p.req.Capacity) {
		return p.conflict(), nil
	}
	if p.inc != "" {
		if err := s.rowLocksFence(t, "a cross-shard aggregate"); err != nil {
			return nil, err
		}
	}
	t.Put(p.aggKey, p.record().Encode())
	reserved := p.held(got)
	reserved.State = authority.AllocationReserved
	t.Put(s.keys.CapacityAggregate(reserved, p.fence), s.capacityValue(t, reserved.State, reserved.Capacity))
	s.touchCapacity(t, reserved)
	return nil, nil
}

// send sends the prepare and classifies a failed one from its Else reads.
func (p *aggregatePrepare) send(ctx context.Context, pt preparedTxn) (*authority.PrepareAggregateResult, error) {
	s := p.s
	tresp, err := s.sendWrite(ctx, pt.t, "the aggregate prepare")
	if err != nil {
		return nil, err
	}
	if tresp.Succeeded {
		s.aggs.Put(p.aggKey, knownAggregate{p.record(), tresp.Header.Revision}, true)
		return &authority.PrepareAggregateResult{Kind: authority.KindPrepared, Fence: p.fence}, nil
	}
	failed := txnkit.ReadsOf(tresp)
	if recordRev(failed[p.aggKey]) != pt.expiredRev {
		// the record was written (or its expired one removed) since the
		// read: it decides before any liveness, as the contract reads it
		// first
		return nil, nil
	}
	for lk := range pt.liveSeen {
		if failed[lk] == nil {
			return p.conflict(), nil // a preserve participant's owner is not live
		}
	}
	// a row, the record, the target's liveness or its capacity changed since
	// the read: evaluate again
	return nil, nil
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
func (s *Store) readWithRows(ctx context.Context, first, gets []clientv3.Op) (*clientv3.TxnResponse, txnkit.Reads, error) {
	resp, err := s.read(ctx, append(slices.Clip(first), gets...)...)
	if err == nil {
		return resp, txnkit.ReadsOf(resp), nil
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
	got := txnkit.ReadsOf(resp)
	maps.Copy(got, rows)
	return resp, got, nil
}

// checkAggregateFits refuses an aggregate whose prepare or commit Txn
// cannot fit the configured limits, when its newOwner participants leave
// sourceNodes node lifecycles (each a capacity epoch the commit touches).
func (s *Store) checkAggregateFits(req *authority.AggregatePrepareRequest, sourceNodes int) error {
	n := len(req.Participants)
	commit := &txnkit.Txn{Bytes: 4096}
	prepare := &txnkit.Txn{Bytes: 4096}
	for i := 0; i < n; i++ {
		p := req.Participants[i]
		// the commit rewrites the row with its payload, and its capacity
		// entry and owner index; the prepare compares the row
		commit.Bytes += len(s.keys.Row(p.AuthorityKey)) + len(p.AuthorityPayload) + 512 + 4*(len(s.keys.Namespace())+len(p.AuthorityKey)+200)
		commit.Bytes += 2 * (len(s.keys.RowLock(p.AuthorityKey)) + txnkit.OpOverhead) // its row lock's compare and read
		prepare.Bytes += len(s.keys.Row(p.AuthorityKey)) + 2*txnkit.OpOverhead
	}
	// the prepare puts the prepared record, which holds every payload and
	// membership mutation; the commit puts the finished one, which holds
	// none (withoutPayloads): sizes from the record's own encoder
	fence := authority.Fence{AggregateID: req.AggregateID, AggregateGeneration: req.AggregateGeneration}
	prepared := &schema.AggregateRecord{State: schema.AggregatePrepared, Request: *req}
	finished := &schema.AggregateRecord{State: schema.AggregateCommitted, Request: withoutPayloads(req), ExpiresAt: s.clock.Now().Add(s.retention)}
	key := len(s.keys.Aggregate(fence)) + txnkit.OpOverhead
	prepare.Bytes += key + len(prepared.Encode())
	commit.Bytes += key + len(finished.Encode())
	// compares: a row, its row lock and at most one owner liveness per
	// participant, the record and the target's liveness; ops: see
	// aggregateOpsPerParticipant.
	commitOps := max(3*n+2, aggregateOpsPerParticipant*n+4+sourceNodes)
	prepareOps := 2*n + 4 + s.fenceCmps()
	for _, c := range []struct {
		t   *txnkit.Txn
		ops int
	}{{commit, commitOps}, {prepare, prepareOps}} {
		if c.ops > s.maxOps {
			return txnkit.LimitError(txnkit.FlagMaxTxnOps, "an aggregate of "+itoa(int64(n))+" participants needs up to "+itoa(int64(c.ops))+
				" operations in one transaction, more than "+itoa(int64(s.maxOps))+"; it", nil)
		}
		if c.t.Bytes > s.maxBytes {
			return txnkit.LimitError(txnkit.FlagMaxRequestBytes, "the aggregate needs a request of about "+itoa(int64(c.t.Bytes))+
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
func (s *Store) loadAggregate(ctx context.Context, fence authority.Fence) (rec *schema.AggregateRecord, rev int64, known bool, err error) {
	aggKey := s.keys.Aggregate(fence)
	if k, ok := s.aggs.Get(aggKey); ok && s.aggregateLive(k.rec) {
		return k.rec, k.rev, true, nil
	}
	rec, rev, err = s.readAggregate(ctx, aggKey)
	return rec, rev, false, err
}

// readAggregate reads the record at aggKey.
func (s *Store) readAggregate(ctx context.Context, aggKey string) (*schema.AggregateRecord, int64, error) {
	resp, err := s.read(ctx, opGet(aggKey))
	if err != nil {
		return nil, 0, err
	}
	return s.seenAggregate(aggKey, txnkit.ReadsOf(resp)[aggKey])
}

// seenAggregate decodes a read record kv (nil: none) and remembers it.
func (s *Store) seenAggregate(aggKey string, kv *mvccpbKV) (*schema.AggregateRecord, int64, error) {
	if kv == nil {
		return nil, 0, nil
	}
	rec, err := schema.DecodeAggregate(kv)
	if err != nil {
		return nil, 0, err
	}
	s.aggs.Put(aggKey, knownAggregate{rec, kv.ModRevision}, true)
	if !s.aggregateLive(rec) {
		return nil, kv.ModRevision, nil
	}
	return rec, kv.ModRevision, nil
}

// aggregateLive reports whether rec has not expired (a prepared record
// never does).
func (s *Store) aggregateLive(rec *schema.AggregateRecord) bool {
	return rec.ExpiresAt.IsZero() || rec.ExpiresAt.After(s.clock.Now())
}

// finished returns the committed or aborted successor of rec, which
// expires after the store's retention, and that retention.
func (s *Store) finished(rec *schema.AggregateRecord, state string) (*schema.AggregateRecord, time.Duration) {
	return &schema.AggregateRecord{State: state, Request: withoutPayloads(&rec.Request), ExpiresAt: s.clock.Now().Add(s.retention)}, s.retention
}

// withoutPayloads is req without its participants' payloads and membership
// mutations: what a finished (committed or aborted) record keeps. Nothing
// reads them from a finished record (a retried commit or abort is answered
// from its state, a prepare of a finished fence is stale or a conflict), so
// the commit Txn carries every payload once, in its row, not twice.
func withoutPayloads(req *authority.AggregatePrepareRequest) authority.AggregatePrepareRequest {
	c := *req
	c.Participants = make([]authority.AggregateParticipant, len(req.Participants))
	for i, p := range req.Participants {
		p.AuthorityPayload, p.MembershipMutation = nil, nil
		c.Participants[i] = p
	}
	return c
}

// sendFinished sends t plus the put of the finished record done at aggKey
// on a lease that outlives it, and the read of aggKey in the Else (its
// first).
func (s *Store) sendFinished(ctx context.Context, t *txnkit.Txn, aggKey string, done *schema.AggregateRecord, ttl time.Duration, what string) (*clientv3.TxnResponse, error) {
	var resp *clientv3.TxnResponse
	err := s.leases.withLeases(ctx, []time.Duration{ttl}, func(ids []clientv3.LeaseID) error {
		tt := t.Clone()
		tt.Put(aggKey, done.Encode(), clientv3.WithLease(ids[0]))
		tt.OrGet(aggKey)
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
	aggKey := s.keys.Aggregate(fence)
	rec, rev, known, err := s.loadAggregate(ctx, fence)
	if err != nil {
		return authority.CommitAggregateResult{}, err
	}
	return s.commitAggregate(ctx, aggKey, rec, rev, known)
}

// commitAggregate commits the record rec at rev (nil: none); known says it
// is the store's memory of the record rather than a read.
func (s *Store) commitAggregate(ctx context.Context, aggKey string, rec *schema.AggregateRecord, rev int64, known bool) (authority.CommitAggregateResult, error) {
	stale := authority.CommitAggregateResult{Kind: authority.KindStale}
	if rec == nil {
		return stale, nil
	}
	switch rec.State {
	case schema.AggregateCommitted:
		return authority.CommitAggregateResult{Kind: authority.KindAlreadyCommitted}, nil
	case schema.AggregatePrepared:
		if err := crossShardOnly(rec); err != nil {
			if known { // remembered: it may have been withdrawn since
				fresh, freshRev, err := s.readAggregate(ctx, aggKey)
				if err != nil {
					return authority.CommitAggregateResult{}, err
				}
				return s.commitAggregate(ctx, aggKey, fresh, freshRev, false)
			}
			return authority.CommitAggregateResult{}, err
		}
	default:
		return stale, nil
	}
	rows, fresh, err := s.commitRows(ctx, aggKey, rec, rev, known)
	if err != nil {
		return authority.CommitAggregateResult{}, err
	}
	if fresh != nil { // another store changed the record: it decides
		return s.commitAggregate(ctx, aggKey, fresh.rec, fresh.rev, false)
	}
	t, next := s.buildAggregateCommit(aggKey, rec, rev, rows)
	if t == nil {
		return stale, nil
	}
	done, ttl := s.finished(rec, schema.AggregateCommitted)
	tresp, err := s.sendFinished(ctx, t, aggKey, done, ttl, "the aggregate commit")
	if err != nil {
		return authority.CommitAggregateResult{}, err
	}
	if !tresp.Succeeded {
		return s.aggregateCommitFailed(ctx, aggKey, tresp, rev, known)
	}
	s.aggs.Put(aggKey, knownAggregate{done, tresp.Header.Revision}, true)
	tokens := map[authority.Key]int64{}
	for i, n := range next {
		n.Written(tresp.Header.Revision)
		if rec.Request.Participants[i].OwnerTransition == authority.TransitionNewOwner {
			tokens[n.Key] = n.Token
		}
		s.remember(n)
	}
	return authority.CommitAggregateResult{Kind: authority.KindCommitted, OwnershipTokens: tokens}, nil
}

// commitRows returns the participants' rows at their expected versions,
// from the cache or one read. A remembered record (known) is read with the
// rows, since another store may have committed or aborted it: when it
// changed, fresh is the record now in etcd and rows are nil.
func (s *Store) commitRows(ctx context.Context, aggKey string, rec *schema.AggregateRecord, rev int64, known bool) (rows []*schema.Row, fresh *knownAggregate, err error) {
	req := &rec.Request
	rows = make([]*schema.Row, len(req.Participants))
	var missing []int
	for i, p := range req.Participants {
		if rows[i] = s.cachedRow(p.AuthorityKey, p.ExpectedStoreVersion); rows[i] == nil {
			missing = append(missing, i)
		}
	}
	if len(missing) == 0 {
		return rows, nil, nil
	}
	ops := make([]clientv3.Op, len(missing), len(missing)+1)
	for j, i := range missing {
		ops[j] = opGet(s.keys.Row(req.Participants[i].AuthorityKey))
	}
	if known {
		ops = append(ops, opGet(aggKey))
	}
	rresp, err := s.read(ctx, ops...)
	if err != nil {
		return nil, nil, err
	}
	got := txnkit.ReadsOf(rresp)
	if known {
		cur, curRev, err := s.seenAggregate(aggKey, got[aggKey])
		if err != nil {
			return nil, nil, err
		}
		if curRev != rev {
			return nil, &knownAggregate{cur, curRev}, nil
		}
	}
	for _, i := range missing {
		if rows[i], err = s.rowIn(got, req.Participants[i].AuthorityKey); err != nil {
			return nil, nil, err
		}
	}
	return rows, nil, nil
}

// buildAggregateCommit builds the commit of rec at rev over rows: every row
// fenced on its version and every owner involved on its liveness, each row
// rewritten (a newOwner row moved to the target, with its capacity entry
// and owner index). It returns nil when a row is not as prepared (stale),
// and the rows as written (their revision is the Txn's).
func (s *Store) buildAggregateCommit(aggKey string, rec *schema.AggregateRecord, rev int64, rows []*schema.Row) (*txnkit.Txn, []*schema.Row) {
	req := &rec.Request
	t := &txnkit.Txn{}
	t.Cmp(modRevIs(aggKey, rev))
	liveSeen := map[string]bool{}
	live := func(node authority.NodeDescriptor, lifecycle int64, owner authority.OwnerToken) {
		if k := s.keys.Liveness(node, lifecycle, owner); !liveSeen[k] {
			liveSeen[k] = true
			t.Cmp(s.liveCmp(node, lifecycle, owner))
		}
	}
	next := make([]*schema.Row, len(rows))
	for i, p := range req.Participants {
		r := rows[i]
		if r == nil || r.Alloc.State != authority.AllocationActive || r.Version() != p.ExpectedStoreVersion {
			return nil, nil
		}
		t.Cmp(modRevIs(s.keys.Row(p.AuthorityKey), r.ModRev))
		s.lockFree(t, p.AuthorityKey)
		if p.OwnerTransition != authority.TransitionNewOwner {
			live(r.Alloc.Descriptor, r.Alloc.DescriptorLifecycleGeneration, r.Owner)
		} else {
			live(req.TargetDescriptor, req.TargetDescriptorLifecycleGeneration, req.TargetOwner)
		}
		next[i] = s.rewriteParticipant(t, req, p, r)
	}
	reserved := req.TargetAllocation()
	reserved.State = authority.AllocationReserved
	t.Del(s.keys.CapacityAggregate(reserved, req.Fence()))
	s.touchCapacity(t, reserved)
	return t, next
}

// rewriteParticipant adds to t the commit's writes of participant p, whose
// row is r: the row with p's payload, and for a newOwner participant its
// move to req's target (moveToTarget). It returns the row as written.
func (s *Store) rewriteParticipant(t *txnkit.Txn, req *authority.AggregatePrepareRequest, p authority.AggregateParticipant, r *schema.Row) *schema.Row {
	rowKey := s.keys.Row(p.AuthorityKey)
	n := r.Next(0)
	n.Payload = append([]byte(nil), p.AuthorityPayload...)
	if p.OwnerTransition != authority.TransitionNewOwner {
		t.Put(rowKey, s.rowValue(t, n))
		return n
	}
	s.moveToTarget(t, req, rowKey, r, n)
	return n
}

// moveToTarget writes n, the row r at rowKey moved to req's target owner
// and node: the row, and where its capacity is held (placement.go: its
// capacity entry and owner index entry, or its placement key, each moved
// when its key changes).
func (s *Store) moveToTarget(t *txnkit.Txn, req *authority.AggregatePrepareRequest, rowKey string, r, n *schema.Row) {
	m := s.moved(t, r, req.TargetOwner, req.TargetDescriptor, req.TargetDescriptorLifecycleGeneration)
	n.Owner, n.Alloc, n.PlacementKey = m.Owner, m.Alloc, m.PlacementKey
	n.OwnerGen = 0 // every newOwner transition (as the seed's ++ownerGeneration): this write's revision
	if r.Owner != n.Owner || !s.atLeast(storeversion.TokenFollowsOwner) {
		// a new owner or owner lease (or, before TokenFollowsOwner, any
		// newOwner transition): this write's revision; else the row's
		// owner already: it keeps its token
		n.Token = 0
	}
	t.Put(rowKey, s.rowValue(t, n))
	s.replace(t, r, n)
}

// aggregateCommitFailed answers a commit whose Txn failed: the record now
// in etcd decides, not the one this store remembered (another store may
// have aborted it and prepared the fence anew).
func (s *Store) aggregateCommitFailed(ctx context.Context, aggKey string, tresp *clientv3.TxnResponse, rev int64, known bool) (authority.CommitAggregateResult, error) {
	fresh, freshRev, err := s.seenAggregate(aggKey, txnkit.ReadsOf(tresp)[aggKey])
	switch {
	case err != nil:
		return authority.CommitAggregateResult{}, err
	case fresh != nil && fresh.State == schema.AggregateCommitted:
		return authority.CommitAggregateResult{Kind: authority.KindAlreadyCommitted}, nil
	case known && fresh != nil && freshRev != rev:
		return s.commitAggregate(ctx, aggKey, fresh, freshRev, false)
	}
	return authority.CommitAggregateResult{Kind: authority.KindStale}, nil
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
func (s *Store) abortAggregate(ctx context.Context, fence authority.Fence, rec *schema.AggregateRecord, rev int64, known bool) (authority.AbortAggregateResult, error) {
	stale := authority.AbortAggregateResult{Kind: authority.KindStale}
	if rec == nil {
		return stale, nil
	}
	switch rec.State {
	case schema.AggregateAborted:
		return authority.AbortAggregateResult{Kind: authority.KindAlreadyAborted}, nil
	case schema.AggregatePrepared:
		if err := crossShardOnly(rec); err != nil {
			if known { // remembered: it may have been withdrawn since
				fresh, freshRev, err := s.readAggregate(ctx, s.keys.Aggregate(fence))
				if err != nil {
					return authority.AbortAggregateResult{}, err
				}
				return s.abortAggregate(ctx, fence, fresh, freshRev, false)
			}
			return authority.AbortAggregateResult{}, err
		}
	default:
		return stale, nil
	}
	aggKey := s.keys.Aggregate(fence)
	t := &txnkit.Txn{}
	t.Cmp(modRevIs(aggKey, rev))
	aborted, ttl := s.finished(rec, schema.AggregateAborted)
	reserved := rec.Request.TargetAllocation()
	reserved.State = authority.AllocationReserved
	t.Del(s.keys.CapacityAggregate(reserved, fence))
	s.touchCapacity(t, reserved)
	resp, err := s.sendFinished(ctx, t, aggKey, aborted, ttl, "the aggregate abort")
	if err != nil {
		return authority.AbortAggregateResult{}, err
	}
	if resp.Succeeded {
		s.aggs.Put(aggKey, knownAggregate{aborted, resp.Header.Revision}, true)
		return authority.AbortAggregateResult{Kind: authority.KindAborted}, nil
	}
	cur, curRev, err := s.seenAggregate(aggKey, txnkit.ReadsOf(resp)[aggKey])
	switch {
	case err != nil:
		return authority.AbortAggregateResult{}, err
	case cur != nil && cur.State == schema.AggregateAborted:
		return authority.AbortAggregateResult{Kind: authority.KindAlreadyAborted}, nil
	case known && cur != nil && curRev != rev:
		// the record now in etcd decides, not the remembered one
		return s.abortAggregate(ctx, fence, cur, curRev, false)
	}
	return stale, nil
}
