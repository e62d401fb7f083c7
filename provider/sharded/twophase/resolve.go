package twophase

import (
	"context"
	"errors"

	authority "github.com/zlink-systems/authority"
	etcd "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
)

// Resolve clears the row lock l out of a writer's way: it finishes the
// aggregate holding it when that is decided (committed: applied in every
// shard; aborted: released in every shard), releases it when its record is
// gone or of another incarnation, and when the aggregate is still prepared
// takes its record over (no attempt that started before can decide) and
// releases the lock, leaving the aggregate prepared. The write that met the
// lock can then be tried again: as in a store of one cluster, it is ordered
// before the commit (which then finds its row changed) or after it.
func (c *Coordinator) Resolve(ctx context.Context, l etcd.RowLock) error {
	cs, _, err := c.coordinator(l.Lock.Fence.AggregateID)
	if err != nil {
		return err
	}
	row, err := c.shard(c.router.ShardOf(l.Key), "key "+string(l.Key))
	if err != nil {
		return err
	}
	this := etcd.LockSelector{Fence: l.Lock.Fence, Incarnation: l.Lock.Incarnation, Revision: l.Revision}
	rec, err := cs.ReadRecord(ctx, l.Lock.Fence)
	for round := 0; err == nil && round < maxRounds; round++ {
		switch {
		case rec == nil || rec.Incarnation != l.Lock.Incarnation:
			_, err = row.ReleaseLocks(ctx, []authority.Key{l.Key}, this)
			return err
		case rec.State == schema.AggregateCommitted:
			_, err = c.finishCommitted(ctx, cs, rec)
			return err
		case rec.State == schema.AggregateAborted:
			return c.finishAborted(ctx, cs, rec)
		case l.Lock.Base != rec.Revision:
			// its attempt can no longer decide
			_, err = row.ReleaseLocks(ctx, []authority.Key{l.Key}, this)
			return err
		}
		rec, _, err = cs.TakeOver(ctx, rec)
	}
	if err != nil {
		return err
	}
	return authority.Wrap(authority.ErrUnavailable, "resolving a row lock gave up: the aggregate's record kept changing", nil)
}

// Retry runs op, a write through one shard's store, until it ends other
// than with a row lock (etcd.ErrRowLocked), resolving the locks each
// failure names (Resolve). A write that met a lock changed nothing, so
// running it again is safe.
func (c *Coordinator) Retry(ctx context.Context, op func(ctx context.Context) error) error {
	for round := 0; ; round++ {
		err := op(ctx)
		var locked *etcd.RowLockedError
		if !errors.As(err, &locked) || round >= maxRounds {
			return err
		}
		for _, l := range locked.Locks {
			if err := c.Resolve(ctx, l); err != nil {
				return err
			}
		}
	}
}

// ReadAuthority reads the row at key as the contract's read does, after
// every aggregate decided on it: a row locked by a committed aggregate is
// applied first (in every shard of the aggregate) and read again. A row
// locked by a prepared aggregate is answered as read: that aggregate is
// not committed yet.
func (c *Coordinator) ReadAuthority(ctx context.Context, key authority.Key) (authority.ReadResult, error) {
	row, err := c.shard(c.router.ShardOf(key), "key "+string(key))
	if err != nil {
		return authority.ReadResult{}, err
	}
	for round := 0; round < maxRounds; round++ {
		res, l, err := row.ReadLocked(ctx, key)
		if err != nil || l == nil {
			return res, err
		}
		cs, _, err := c.coordinator(l.Lock.Fence.AggregateID)
		if err != nil {
			return authority.ReadResult{}, err
		}
		rec, err := cs.ReadRecord(ctx, l.Lock.Fence)
		if err != nil {
			return authority.ReadResult{}, err
		}
		if rec == nil || rec.Incarnation != l.Lock.Incarnation || rec.State != schema.AggregateCommitted {
			return res, nil
		}
		if _, err := c.finishCommitted(ctx, cs, rec); err != nil {
			return authority.ReadResult{}, err
		}
	}
	return authority.ReadResult{}, authority.Wrap(authority.ErrUnavailable, "reading a row gave up: it kept being locked by committed aggregates", nil)
}
