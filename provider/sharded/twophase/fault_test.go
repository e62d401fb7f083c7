package twophase_test

import (
	"context"
	"sync"

	authority "github.com/zlink-systems/authority"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/sharded/twophase"
)

// killMode is how a killer kills its coordinator at its step.
type killMode int

const (
	// killAfter lets the step's call reach etcd, then answers it with
	// ErrOutcomeUnknown (the process died before it read the reply).
	killAfter killMode = iota
	// killBefore answers the step with ErrOutcomeUnknown without calling
	// (the process died before sending).
	killBefore
	// killCancel lets the step run, then cancels the context every later
	// call runs on (a deadline or a Close mid-operation): the stores fail
	// them with their own errors.
	killCancel
)

func (m killMode) String() string { return [...]string{"after", "before", "cancel"}[m] }

var errKilled = authority.Wrap(authority.ErrOutcomeUnknown, "coordinator killed by the test", nil)

// killer ends a coordinator at its at-th call to any of its shards (0:
// never). From then on, every call fails (killAfter, killBefore) or runs on
// a cancelled context (killCancel).
type killer struct {
	mode   killMode
	at     int
	atName string          // when set: kill at the first call of that name instead
	ctx    context.Context // killCancel: the context later calls run on
	cancel context.CancelFunc

	mu    sync.Mutex
	steps int
	dead  bool
	names []string
}

func newKiller(mode killMode, at int) *killer {
	ctx, cancel := context.WithCancel(context.Background())
	return &killer{mode: mode, at: at, ctx: ctx, cancel: cancel}
}

// killAt returns a killer that kills at the first call named name.
func killAt(mode killMode, name string) *killer {
	k := newKiller(mode, 0)
	k.atName = name
	return k
}

// wrap returns shards behind k.
func (k *killer) wrap(shards []twophase.Shard) []twophase.Shard {
	out := make([]twophase.Shard, len(shards))
	for i, s := range shards {
		out[i] = faultShard{Shard: s, k: k}
	}
	return out
}

// killed reports whether k killed its coordinator.
func (k *killer) killed() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.dead
}

// do runs one call named name as the killer says.
func (k *killer) do(ctx context.Context, name string, call func(context.Context) error) error {
	k.mu.Lock()
	k.steps++
	k.names = append(k.names, name)
	kill := !k.dead && (k.atName == "" && k.steps == k.at || k.atName != "" && name == k.atName)
	dead := k.dead
	if kill {
		k.dead = true
	}
	k.mu.Unlock()
	if k.mode == killCancel {
		if dead {
			ctx = k.ctx // after the kill: a context that has ended
		}
		err := call(ctx)
		if kill {
			k.cancel()
		}
		return err
	}
	if dead || kill && k.mode == killBefore {
		return errKilled
	}
	err := call(ctx)
	if kill {
		return errKilled
	}
	return err
}

// faultShard is a shard whose every call goes through a killer.
type faultShard struct {
	twophase.Shard
	k *killer
}

func (f faultShard) PrepareAggregate(ctx context.Context, req authority.AggregatePrepareRequest) (res authority.PrepareAggregateResult, err error) {
	err = f.k.do(ctx, "PrepareAggregate", func(ctx context.Context) error {
		res, err = f.Shard.PrepareAggregate(ctx, req)
		return err
	})
	return res, err
}

func (f faultShard) CommitAggregate(ctx context.Context, fence authority.Fence) (res authority.CommitAggregateResult, err error) {
	err = f.k.do(ctx, "CommitAggregate", func(ctx context.Context) error {
		res, err = f.Shard.CommitAggregate(ctx, fence)
		return err
	})
	return res, err
}

func (f faultShard) AbortAggregate(ctx context.Context, fence authority.Fence) (res authority.AbortAggregateResult, err error) {
	err = f.k.do(ctx, "AbortAggregate", func(ctx context.Context) error {
		res, err = f.Shard.AbortAggregate(ctx, fence)
		return err
	})
	return res, err
}

func (f faultShard) PrepareCrossShard(ctx context.Context, req authority.AggregatePrepareRequest, foreign []etcdstore.ParticipantCheck) (res authority.PrepareAggregateResult, err error) {
	err = f.k.do(ctx, "PrepareCrossShard", func(ctx context.Context) error {
		res, err = f.Shard.PrepareCrossShard(ctx, req, foreign)
		return err
	})
	return res, err
}

func (f faultShard) ReadRecord(ctx context.Context, fence authority.Fence) (rec *etcdstore.CrossRecord, err error) {
	err = f.k.do(ctx, "ReadRecord", func(ctx context.Context) error {
		rec, err = f.Shard.ReadRecord(ctx, fence)
		return err
	})
	return rec, err
}

func (f faultShard) TakeOver(ctx context.Context, rec *etcdstore.CrossRecord) (next *etcdstore.CrossRecord, ok bool, err error) {
	err = f.k.do(ctx, "TakeOver", func(ctx context.Context) error {
		next, ok, err = f.Shard.TakeOver(ctx, rec)
		return err
	})
	return next, ok, err
}

func (f faultShard) Decide(ctx context.Context, rec *etcdstore.CrossRecord, commit bool) (next *etcdstore.CrossRecord, ok bool, err error) {
	err = f.k.do(ctx, "Decide", func(ctx context.Context) error {
		next, ok, err = f.Shard.Decide(ctx, rec, commit)
		return err
	})
	return next, ok, err
}

func (f faultShard) Finish(ctx context.Context, rec *etcdstore.CrossRecord) (next *etcdstore.CrossRecord, err error) {
	err = f.k.do(ctx, "Finish", func(ctx context.Context) error {
		next, err = f.Shard.Finish(ctx, rec)
		return err
	})
	return next, err
}

func (f faultShard) CheckParticipants(ctx context.Context, keys []authority.Key) (out []etcdstore.ParticipantCheck, err error) {
	err = f.k.do(ctx, "CheckParticipants", func(ctx context.Context) error {
		out, err = f.Shard.CheckParticipants(ctx, keys)
		return err
	})
	return out, err
}

func (f faultShard) LockParticipants(ctx context.Context, rec *etcdstore.CrossRecord, keys []authority.Key, att etcdstore.LockAttempt) (res etcdstore.LockResult, err error) {
	err = f.k.do(ctx, "LockParticipants", func(ctx context.Context) error {
		res, err = f.Shard.LockParticipants(ctx, rec, keys, att)
		return err
	})
	return res, err
}

func (f faultShard) ApplyParticipants(ctx context.Context, rec *etcdstore.CrossRecord, keys []authority.Key) (tokens map[authority.Key]int64, err error) {
	err = f.k.do(ctx, "ApplyParticipants", func(ctx context.Context) error {
		tokens, err = f.Shard.ApplyParticipants(ctx, rec, keys)
		return err
	})
	return tokens, err
}

func (f faultShard) ReleaseLocks(ctx context.Context, keys []authority.Key, sel etcdstore.LockSelector) (n int, err error) {
	err = f.k.do(ctx, "ReleaseLocks", func(ctx context.Context) error {
		n, err = f.Shard.ReleaseLocks(ctx, keys, sel)
		return err
	})
	return n, err
}

func (f faultShard) ReadLocked(ctx context.Context, key authority.Key) (res authority.ReadResult, l *etcdstore.RowLock, err error) {
	err = f.k.do(ctx, "ReadLocked", func(ctx context.Context) error {
		res, l, err = f.Shard.ReadLocked(ctx, key)
		return err
	})
	return res, l, err
}

func (f faultShard) ReservePart(ctx context.Context, rec *etcdstore.CrossRecord, keys []authority.Key) (kind etcdstore.PartKind, err error) {
	err = f.k.do(ctx, "ReservePart", func(ctx context.Context) error {
		kind, err = f.Shard.ReservePart(ctx, rec, keys)
		return err
	})
	return kind, err
}

func (f faultShard) ReleasePart(ctx context.Context, rec *etcdstore.CrossRecord, keys []authority.Key) error {
	return f.k.do(ctx, "ReleasePart", func(ctx context.Context) error {
		return f.Shard.ReleasePart(ctx, rec, keys)
	})
}

func (f faultShard) Withdraw(ctx context.Context, rec *etcdstore.CrossRecord) (ok bool, err error) {
	err = f.k.do(ctx, "Withdraw", func(ctx context.Context) error {
		ok, err = f.Shard.Withdraw(ctx, rec)
		return err
	})
	return ok, err
}
