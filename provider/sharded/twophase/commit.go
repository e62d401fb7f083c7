package twophase

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	authority "github.com/zlink-systems/authority"
	etcd "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
)

var (
	stale            = authority.CommitAggregateResult{Kind: authority.KindStale}
	alreadyCommitted = authority.CommitAggregateResult{Kind: authority.KindAlreadyCommitted}
)

// CommitAggregate commits the aggregate of fence: in its coordinator shard
// as a store of one cluster does when it was prepared there alone, else
// with the two-phase protocol (lock every participant shard, decide, apply
// every shard, finish). A record decided already is finished first
// (alreadyCommitted, or stale after an abort). A commit that finds a shard
// stale releases its locks and answers stale, the record still prepared.
// Once the decision is made, a failure to apply a shard is
// ErrOutcomeUnknown: the aggregate is committed (every read and write of
// its rows finishes it), and a retry answers alreadyCommitted.
func (c *Coordinator) CommitAggregate(ctx context.Context, fence authority.Fence) (authority.CommitAggregateResult, error) {
	if err := authority.ValidateFence(fence); err != nil {
		return authority.CommitAggregateResult{}, err
	}
	cs, _, err := c.coordinator(fence.AggregateID)
	if err != nil {
		return authority.CommitAggregateResult{}, err
	}
	rec, err := cs.ReadRecord(ctx, fence)
	if err != nil {
		return authority.CommitAggregateResult{}, err
	}
	if rec == nil || rec.Incarnation == "" {
		var res authority.CommitAggregateResult
		err := c.Retry(ctx, func(ctx context.Context) error {
			var err error
			res, err = cs.CommitAggregate(ctx, fence)
			return err
		})
		return res, err
	}
	return c.commitCross(ctx, cs, rec)
}

// commitCross commits the cross-shard record rec, re-reading it as other
// attempts, writers and aborts change it.
func (c *Coordinator) commitCross(ctx context.Context, cs Shard, rec *etcd.CrossRecord) (authority.CommitAggregateResult, error) {
	att := etcd.LockAttempt{ID: newID()}
	for round := 0; round < maxRounds; round++ {
		if rec == nil {
			return stale, nil
		}
		switch rec.State {
		case schema.AggregateCommitted:
			if _, err := c.finishCommitted(ctx, cs, rec); err != nil {
				return authority.CommitAggregateResult{}, err
			}
			return alreadyCommitted, nil
		case schema.AggregateAborted:
			if err := c.finishAborted(ctx, cs, rec); err != nil {
				return authority.CommitAggregateResult{}, err
			}
			return stale, nil
		}
		att.Base = rec.Revision
		res, next, err := c.attempt(ctx, cs, rec, att)
		if err != nil || res != nil {
			return derefCommit(res), err
		}
		if err := backOff(ctx, round); err != nil {
			return authority.CommitAggregateResult{}, err
		}
		rec = next
	}
	return authority.CommitAggregateResult{}, authority.Wrap(authority.ErrUnavailable,
		"commitAggregate gave up: the aggregate's record kept changing under it", nil)
}

func derefCommit(r *authority.CommitAggregateResult) authority.CommitAggregateResult {
	if r == nil {
		return authority.CommitAggregateResult{}
	}
	return *r
}

// backOff waits a random time that grows with round (another attempt of
// the same aggregate is likely running: let it finish).
func backOff(ctx context.Context, round int) error {
	if round == 0 {
		return ctx.Err()
	}
	d := time.Duration(1+rand.IntN(10*min(round, 8))) * time.Millisecond
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return authority.Wrap(authority.ErrUnavailable, "commitAggregate ended with its context", ctx.Err())
	}
}

// attempt is one commit attempt att of the prepared rec: lock, decide,
// apply, finish. It returns the outcome, or the record to try again from
// (nil result and error).
func (c *Coordinator) attempt(ctx context.Context, cs Shard, rec *etcd.CrossRecord, att etcd.LockAttempt) (*authority.CommitAggregateResult, *etcd.CrossRecord, error) {
	by, order, err := c.groups(&rec.Request)
	if err != nil {
		return nil, nil, err
	}
	mine := etcd.LockSelector{Fence: rec.Fence(), Incarnation: rec.Incarnation, Attempt: att.ID}
	release := func() { c.releaseEach(ctx, by, order, mine) }
	out, next, err := c.lockAll(ctx, cs, rec, att, by, order)
	if err != nil || out != nil || next != nil {
		release()
		return out, next, err
	}
	decided, applied, err := cs.Decide(ctx, rec, true)
	if err != nil {
		if !errors.Is(err, authority.ErrOutcomeUnknown) {
			release()
		}
		return nil, nil, err
	}
	if !applied {
		release() // this attempt can no longer decide
		return nil, decided, nil
	}
	tokens, err := c.finishCommitted(ctx, cs, decided)
	if err != nil {
		return nil, nil, authority.Wrap(authority.ErrOutcomeUnknown,
			fmt.Sprintf("aggregate %s/%d is committed, but applying it did not finish (any read or write of its rows finishes it; a retry answers alreadyCommitted)",
				rec.Request.AggregateID, rec.Request.AggregateGeneration), err)
	}
	return &authority.CommitAggregateResult{Kind: authority.KindCommitted, OwnershipTokens: tokens}, nil, nil
}

// lockAll locks every participant shard for att. It returns stale when a
// shard is, the record to start again from when the attempt can no longer
// decide (another attempt of the aggregate holds locks: the record was
// taken over), or neither when every shard is locked. Locks of other
// aggregates in the way are resolved (Resolve) and the shards locked again.
func (c *Coordinator) lockAll(ctx context.Context, cs Shard, rec *etcd.CrossRecord, att etcd.LockAttempt, by map[int][]authority.Key, order []int) (*authority.CommitAggregateResult, *etcd.CrossRecord, error) {
	held := map[int]bool{}
	for round := 0; round < maxRounds; round++ {
		pending := make([]int, 0, len(order))
		for _, i := range order {
			if !held[i] {
				pending = append(pending, i)
			}
		}
		results := make([]etcd.LockResult, len(c.shards))
		err := eachShard(pending, func(i int) error {
			var err error
			results[i], err = c.shards[i].LockParticipants(ctx, rec, by[i], att)
			return err
		})
		if err != nil {
			return nil, nil, notDecided(rec, err)
		}
		var blockers []etcd.RowLock
		unreserved := false
		for _, i := range pending {
			switch r := results[i]; r.Kind {
			case etcd.LockStale:
				if r.Unreserved {
					unreserved = true
					continue
				}
				return c.staleShard(ctx, cs, rec)
			case etcd.LockBlocked:
				blockers = append(blockers, r.Locks...)
			default:
				held[i] = true
			}
		}
		if unreserved {
			// a prepare stopped before reserving every part: reserve
			// them, and lock again
			if out, err := c.reserveParts(ctx, rec, c.router.CoordinatorOf(rec.Request.AggregateID)); err != nil || out != partsHeld {
				if err != nil {
					return nil, nil, notDecided(rec, err)
				}
				return c.staleShard(ctx, cs, rec)
			}
			continue
		}
		if len(blockers) == 0 {
			return nil, nil, nil
		}
		if next, err := c.clear(ctx, cs, rec, att, blockers); err != nil || next != nil {
			return nil, next, err
		}
	}
	return nil, nil, authority.Wrap(authority.ErrUnavailable, "commitAggregate gave up: its rows kept being locked by others", nil)
}

// staleShard answers a commit that found a shard stale: the record decides
// first (another commit of the aggregate may have committed it, changing its
// rows: then the attempt starts again from the record, and finishes it),
// else stale.
func (c *Coordinator) staleShard(ctx context.Context, cs Shard, rec *etcd.CrossRecord) (*authority.CommitAggregateResult, *etcd.CrossRecord, error) {
	now, err := cs.ReadRecord(ctx, rec.Fence())
	if err != nil {
		return nil, nil, notDecided(rec, err)
	}
	if now != nil && now.Incarnation == rec.Incarnation && now.State != schema.AggregatePrepared {
		return nil, now, nil
	}
	return &stale, nil, nil
}

// notDecided is the error of a commit that failed before its decision: the
// aggregate is as it was (still prepared), whatever the failed lock did.
func notDecided(rec *etcd.CrossRecord, err error) error {
	if errors.Is(err, authority.ErrOutcomeUnknown) {
		return authority.Wrap(authority.ErrUnavailable, fmt.Sprintf("aggregate %s/%d was not committed (no decision was sent)",
			rec.Request.AggregateID, rec.Request.AggregateGeneration), err)
	}
	return err
}

// clear deals with the locks in att's way: a lock of another attempt of
// the same incarnation means the record is to be taken over (when that
// attempt started from the same record) or was (a later attempt): it
// returns the record to start again from. Any other lock is resolved.
func (c *Coordinator) clear(ctx context.Context, cs Shard, rec *etcd.CrossRecord, att etcd.LockAttempt, blockers []etcd.RowLock) (*etcd.CrossRecord, error) {
	for _, b := range blockers {
		if b.Lock.Fence != rec.Fence() || b.Lock.Incarnation != rec.Incarnation {
			if err := c.Resolve(ctx, b); err != nil {
				return nil, err
			}
			continue
		}
		if b.Lock.Base == att.Base {
			next, _, err := cs.TakeOver(ctx, rec)
			return next, notDecided(rec, err)
		}
		next, err := cs.ReadRecord(ctx, rec.Fence()) // a later attempt took the record over
		return next, err
	}
	return nil, nil
}

// releaseEach releases the locks sel selects in every shard of order, as
// far as ctx allows: a lock left is harmless (whoever meets it takes the
// record over and releases it, the aggregate staying prepared).
func (c *Coordinator) releaseEach(ctx context.Context, by map[int][]authority.Key, order []int, sel etcd.LockSelector) {
	_ = eachShard(order, func(i int) error {
		_, err := c.shards[i].ReleaseLocks(ctx, by[i], sel)
		return err
	})
}

// finishCommitted applies the committed rec in every shard and finishes
// it, returning the newOwner rows' ownership tokens (of the parts whose
// markers are still there).
func (c *Coordinator) finishCommitted(ctx context.Context, cs Shard, rec *etcd.CrossRecord) (map[authority.Key]int64, error) {
	if rec.Finished {
		return nil, nil
	}
	by, order, err := c.groups(&rec.Request)
	if err != nil {
		return nil, err
	}
	parts := make([]map[authority.Key]int64, len(c.shards))
	err = eachShard(order, func(i int) error {
		var err error
		parts[i], err = c.shards[i].ApplyParticipants(ctx, rec, by[i])
		return err
	})
	if err != nil {
		return nil, err
	}
	if _, err := cs.Finish(ctx, rec); err != nil {
		return nil, err
	}
	tokens := map[authority.Key]int64{}
	for _, p := range parts {
		for k, v := range p {
			tokens[k] = v
		}
	}
	return tokens, nil
}

// finishAborted releases the aborted rec's locks and capacity parts in
// every shard and finishes it. It releases them even when rec is finished: a commit attempt
// whose lock Txn was in flight when the abort released the shards can land
// its locks after (the rows unchanged, its compares hold), and they must
// not wait for the record to expire.
func (c *Coordinator) finishAborted(ctx context.Context, cs Shard, rec *etcd.CrossRecord) error {
	by, order, err := c.groups(&rec.Request)
	if err != nil {
		return err
	}
	sel := etcd.LockSelector{Fence: rec.Fence(), Incarnation: rec.Incarnation}
	err = eachShard(order, func(i int) error {
		_, err := c.shards[i].ReleaseLocks(ctx, by[i], sel)
		return err
	})
	if err == nil {
		err = c.releaseParts(ctx, rec, c.router.CoordinatorOf(rec.Request.AggregateID))
	}
	if err != nil || rec.Finished {
		return err
	}
	_, err = cs.Finish(ctx, rec)
	return err
}
