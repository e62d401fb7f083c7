package sharded

import (
	"errors"
	"fmt"
)

// ErrShardMapMismatch reports that the shard map stored in a shard's
// namespace is not the store's configured one (another cluster list, order,
// namespace, epoch or hash), that a namespace holds rows but no map where a
// map of several shards is needed, or that a read-only store found no map
// where it needs one. New refuses to open; the error names the shard and the
// difference. Nothing is written.
var ErrShardMapMismatch = errors.New("sharded: shard map mismatch")

// ErrCrossShardAggregate reports an aggregate whose participants live in more
// than one shard, on a store configured to refuse them
// (Config.RefuseCrossShardAggregates): PrepareAggregate refuses it with an
// error wrapping this and authority.ErrInvalidArgument, naming the shards,
// and writes nothing.
var ErrCrossShardAggregate = errors.New("sharded: aggregate spans shards")

// ErrCapacityNeedsEscrow reports a shard map that grew to several shards
// under a store that runs no capacity escrow (one opened over one shard
// without Spares; each shard would check a capacity policy against its own
// rows only): with a policy it does not route by the grown map (wrapping
// authority.ErrUnavailable), and without one it refuses a policy
// afterwards (SetCapacityPolicy, wrapping authority.ErrInvalidArgument).
// Such a store cannot reach a cluster a resharding adds anyway (its reload
// fails first, ErrUnavailable naming the cluster): this is the guard behind
// it. A store opened over several shards, or over one with Spares, runs
// escrow and follows a grown map with its policy.
var ErrCapacityNeedsEscrow = errors.New("sharded: the capacity escrow does not follow the grown shard map")

// shardError is an error of one shard's store, naming the shard.
type shardError struct {
	shard int
	err   error
}

func (e *shardError) Error() string { return fmt.Sprintf("shard %d: %v", e.shard, e.err) }

func (e *shardError) Unwrap() error { return e.err }

// inShard names shard i in err (nil stays nil; an error that already names a
// shard is returned as it is).
func inShard(i int, err error) error {
	if err == nil {
		return nil
	}
	var se *shardError
	if errors.As(err, &se) {
		return err
	}
	return &shardError{shard: i, err: err}
}
