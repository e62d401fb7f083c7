package twophase

import (
	"context"
	"fmt"

	authority "github.com/zlink-systems/authority"
	etcd "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
)

// AbortAggregate aborts the aggregate of fence: in its coordinator shard as
// a store of one cluster does when it was prepared there alone, else by
// deciding aborted (which releases the target's reserved capacity and ends
// every commit attempt), releasing every shard's locks and capacity parts
// and finishing the record. Once the decision is made the answer is
// aborted, or ErrOutcomeUnknown when releasing did not finish (aborting
// again finishes it and answers alreadyAborted; a lock left is also
// released by whoever meets it).
func (c *Coordinator) AbortAggregate(ctx context.Context, fence authority.Fence) (authority.AbortAggregateResult, error) {
	if err := authority.ValidateFence(fence); err != nil {
		return authority.AbortAggregateResult{}, err
	}
	cs, _, err := c.coordinator(fence.AggregateID)
	if err != nil {
		return authority.AbortAggregateResult{}, err
	}
	rec, err := cs.ReadRecord(ctx, fence)
	if err != nil {
		return authority.AbortAggregateResult{}, err
	}
	if rec == nil || rec.Incarnation == "" {
		return cs.AbortAggregate(ctx, fence)
	}
	return c.abortCross(ctx, cs, rec)
}

// abortCross aborts the cross-shard record rec.
func (c *Coordinator) abortCross(ctx context.Context, cs Shard, rec *etcd.CrossRecord) (authority.AbortAggregateResult, error) {
	for round := 0; round < maxRounds; round++ {
		if rec == nil {
			return authority.AbortAggregateResult{Kind: authority.KindStale}, nil
		}
		switch rec.State {
		case schema.AggregateAborted:
			if err := c.finishAborted(ctx, cs, rec); err != nil {
				return authority.AbortAggregateResult{}, err
			}
			return authority.AbortAggregateResult{Kind: authority.KindAlreadyAborted}, nil
		case schema.AggregateCommitted:
			if _, err := c.finishCommitted(ctx, cs, rec); err != nil {
				return authority.AbortAggregateResult{}, err
			}
			return authority.AbortAggregateResult{Kind: authority.KindStale}, nil
		}
		decided, applied, err := cs.Decide(ctx, rec, false)
		if err != nil {
			return authority.AbortAggregateResult{}, err
		}
		if applied {
			if err := c.finishAborted(ctx, cs, decided); err != nil {
				// a lock left is released by whoever meets it, but a
				// capacity part only by finishing the abort
				return authority.AbortAggregateResult{}, authority.Wrap(authority.ErrOutcomeUnknown, fmt.Sprintf(
					"aggregate %s/%d is aborted, but releasing it in every shard did not finish (abort it again: it answers alreadyAborted once done)",
					rec.Request.AggregateID, rec.Request.AggregateGeneration), err)
			}
			return authority.AbortAggregateResult{Kind: authority.KindAborted}, nil
		}
		rec = decided
	}
	return authority.AbortAggregateResult{}, authority.Wrap(authority.ErrUnavailable,
		"abortAggregate gave up: the aggregate's record kept changing under it", nil)
}
