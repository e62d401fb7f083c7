package twophase

import (
	"context"
	"fmt"

	authority "github.com/zlink-systems/authority"
	etcd "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
)

// The target's capacity, shard by shard. A commit moves each newOwner
// participant's row, and its capacity entry, onto the target in the row's
// own shard, so a prepare reserves in every shard the capacity its commit
// moves in there (its part): the coordinator shard in the record's Txn,
// every other participant shard after the record (etcd.CrossShard.
// ReservePart). A prepare answers prepared only once every part is held; a
// part refused (the policy or the budget of that shard says no, a row moved
// on) aborts the aggregate, releases what was reserved and withdraws the
// record: the prepare is a conflict and leaves nothing, as in one store.
// Each shard's lock fences its part; a lock that finds it missing (a prepare
// whose coordinator stopped between the record and the part) makes the
// commit reserve it, then lock again (lockAll). An abort releases every
// part (finishAborted). So every
// shard's count holds what its commit will hold, and in escrow mode a
// budget slice is never short of what a commit moves in
// (provider/sharded/escrow).

// partOutcome is what reserveParts found.
type partOutcome int

const (
	partsHeld     partOutcome = iota // every part is reserved
	partsRefused                     // a part was refused, or a row moved on
	partsFinished                    // a shard applied or released the incarnation's part: the record was decided
)

// partShards returns the shards other than the coordinator shard ci that
// rec's commit moves rows into (ascending), and rec's participant keys by
// shard.
func (c *Coordinator) partShards(rec *etcd.CrossRecord, ci int) ([]int, map[int][]authority.Key, error) {
	by, order, err := c.groups(&rec.Request)
	if err != nil {
		return nil, nil, err
	}
	moves := map[int]bool{}
	for _, p := range rec.Request.Participants {
		if p.OwnerTransition == authority.TransitionNewOwner {
			moves[c.router.ShardOf(p.AuthorityKey)] = true
		}
	}
	var out []int
	for _, i := range order {
		if i != ci && moves[i] {
			out = append(out, i)
		}
	}
	return out, by, nil
}

// reserveParts reserves rec's part in every shard its commit moves rows
// into but the coordinator shard ci (whose part the record's Txn
// reserved), in parallel.
func (c *Coordinator) reserveParts(ctx context.Context, rec *etcd.CrossRecord, ci int) (partOutcome, error) {
	order, by, err := c.partShards(rec, ci)
	if err != nil {
		return 0, err
	}
	kinds := make([]etcd.PartKind, len(c.shards))
	err = eachShard(order, func(i int) error {
		var err error
		kinds[i], err = c.shards[i].ReservePart(ctx, rec, by[i])
		return err
	})
	if err != nil {
		return 0, err
	}
	out := partsHeld
	for _, i := range order {
		switch kinds[i] {
		case etcd.PartFinished:
			return partsFinished, nil
		case etcd.PartRefused, etcd.PartStale:
			out = partsRefused
		}
	}
	return out, nil
}

// releaseParts releases the aborted rec's part in every shard its commit
// would have moved rows into but the coordinator shard ci (whose part the
// abort's decision released).
func (c *Coordinator) releaseParts(ctx context.Context, rec *etcd.CrossRecord, ci int) error {
	order, by, err := c.partShards(rec, ci)
	if err != nil {
		return err
	}
	return eachShard(order, func(i int) error { return c.shards[i].ReleasePart(ctx, rec, by[i]) })
}

// prepared finishes the cross-shard prepare whose record the coordinator
// shard cs (index ci) answered with res: every part reserved, the answer
// stands; a part refused, the aggregate is aborted and its record withdrawn,
// and the answer is conflict.
func (c *Coordinator) prepared(ctx context.Context, cs Shard, ci int, res authority.PrepareAggregateResult) (authority.PrepareAggregateResult, error) {
	rec, err := cs.ReadRecord(ctx, res.Fence)
	if err != nil {
		return authority.PrepareAggregateResult{}, unfinishedPrepare(res.Fence, err)
	}
	if rec == nil || rec.Incarnation == "" || rec.State != schema.AggregatePrepared {
		return res, nil // decided since (by a commit or an abort of the fence)
	}
	out, err := c.reserveParts(ctx, rec, ci)
	if err != nil {
		return authority.PrepareAggregateResult{}, unfinishedPrepare(res.Fence, err)
	}
	if out == partsHeld {
		return res, nil
	}
	if out == partsRefused {
		if _, err := c.abortCross(ctx, cs, rec); err != nil {
			return authority.PrepareAggregateResult{}, err
		}
		if done, err := cs.ReadRecord(ctx, res.Fence); err == nil && done != nil && done.Incarnation == rec.Incarnation &&
			done.State == schema.AggregateAborted && done.Finished {
			_, _ = cs.Withdraw(ctx, done) // else it stays aborted until it expires
		}
	}
	return authority.PrepareAggregateResult{Kind: authority.KindConflict}, nil
}

// unfinishedPrepare is the error of a prepare whose record is written but
// whose parts may not all be: preparing it again (the same request)
// finishes it, aborting it releases what it holds.
func unfinishedPrepare(fence authority.Fence, err error) error {
	return authority.Wrap(authority.ErrUnavailable, fmt.Sprintf(
		"aggregate %s/%d is recorded but its capacity may not be reserved in every shard yet (prepare it again to finish, or abort it)",
		fence.AggregateID, fence.AggregateGeneration), err)
}
