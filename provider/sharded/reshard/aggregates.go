package reshard

import (
	"context"
	"fmt"

	authority "github.com/zlink-systems/authority"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/sharded"
	"github.com/zlink-systems/authority/provider/sharded/twophase"
)

// Aggregates at the switch. An aggregate whose participants live in one
// shard is that shard's: its record and capacity in one cluster. One across
// shards (package twophase) has its record in its coordinator shard, which
// a growth does not change (the map's home shards, schema.ShardMap.Homes),
// a capacity part in each shard its commit moves rows into, and while a
// commit decides, a row lock on each participant in the participant's shard
// (schema.MoveResolved). The rows move; the record, the parts and the part
// markers stay (schema.MoveStays). So before the copy takes its last changes
// the switch settles, with the sources frozen (no commit can lock or decide
// there any more: every such Txn fails its map fence, and stores refuse
// commits and aborts in a frozen shard):
//
//  1. every prepared aggregate with a participant that moves is aborted:
//     one of a shard by that shard's store, one across shards through the
//     protocol (its decision, then its locks and parts released in every
//     shard), each Txn fenced on the frozen map. Its part in the moving
//     row's shard could not follow the row, and its commit would lock and
//     apply the row where it no longer is.
//  2. every row lock left on a moving row is resolved through the protocol:
//     an aggregate committed before the freeze is applied in every shard
//     (the moving row's new state is then copied with the last changes),
//     an aborted one released, a lock of a gone or other incarnation
//     released.
//  3. the sources are listed again until no lock of a moving row is left;
//     each source's revision then is where the copy must follow it to.
//
// An aggregate across shards whose participants all stay is left as it
// is: its record, parts and rows stay where they were, and its commit
// after the switch finds them.

// maxSettleRounds bounds how often the switch lists the sources' locks
// again.
const maxSettleRounds = 8

// frozenRouter places rows and coordinator records by the map the move
// starts from.
type frozenRouter struct{ m schema.ShardMap }

func (r frozenRouter) ShardOf(key authority.Key) int { return sharded.Place(key, len(r.m.Shards)) }
func (r frozenRouter) CoordinatorOf(aggregateID string) int {
	return sharded.PlaceCoordinator(aggregateID, r.m)
}

// frozenCoordinator is the two-phase protocol over the frozen sources,
// every call fenced on the source's frozen map key.
func (j *job) frozenCoordinator() (*twophase.Coordinator, error) {
	shards := make([]twophase.Shard, len(j.srcs))
	for i, s := range j.srcs {
		shards[i] = sharded.FencedShard(s, j.rec.Sources[i].Frozen)
	}
	return twophase.New(shards, frozenRouter{j.rec.Move.From})
}

// settleAggregates aborts the prepared aggregates of moving rows and
// resolves every row lock of a moving row, and returns, by source, the
// revision through which the copy must follow it.
func (j *job) settleAggregates(ctx context.Context) ([]int64, error) {
	coord, err := j.frozenCoordinator()
	if err != nil {
		return nil, err
	}
	if err := j.abortAggregates(ctx, coord); err != nil {
		return nil, err
	}
	for round := 0; ; round++ {
		locks, err := j.movingLocks(ctx)
		if err != nil {
			return nil, err
		}
		if len(locks) == 0 {
			break
		}
		if round == maxSettleRounds {
			return nil, fmt.Errorf("%w: %d row locks of moving rows are left after %d rounds (%s)",
				authority.ErrUnavailable, len(locks), round, locks[0].Key)
		}
		for _, l := range locks {
			j.at(fmt.Sprintf("resolving the lock of aggregate %s/%d on moving row %s", l.Lock.Fence.AggregateID, l.Lock.Fence.AggregateGeneration, l.Key))
			if err := coord.Resolve(ctx, l); err != nil {
				return nil, fmt.Errorf("resolving the lock of aggregate %s on row %s: %w", l.Lock.Fence.AggregateID, l.Key, err)
			}
		}
	}
	through := make([]int64, len(j.srcs))
	for i, s := range j.srcs {
		if through[i], err = s.Moves().Revision(ctx); err != nil {
			return nil, fmt.Errorf("shard %d: %w", i, err)
		}
	}
	return through, nil
}

// movingLocks lists, in every source, the row locks of rows that move.
func (j *job) movingLocks(ctx context.Context) ([]etcdstore.RowLock, error) {
	from, to := len(j.rec.Move.From.Shards), len(j.rec.Move.To.Shards)
	var out []etcdstore.RowLock
	for i, s := range j.srcs {
		err := listAll(ctx, s, schema.SegRowLocks+"/", func(kvs []*kvT) error {
			for _, kv := range kvs {
				kind, row, _ := s.Moves().KindOf(string(kv.Key))
				if kind != schema.MoveResolved || sharded.Place(row, to) != from {
					continue
				}
				l, err := schema.DecodeRowLock(kv)
				if err != nil {
					return err
				}
				out = append(out, etcdstore.RowLock{Key: row, Lock: l, Revision: kv.ModRevision})
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("shard %d: %w", i, err)
		}
	}
	return out, nil
}
