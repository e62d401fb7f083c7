package sharded

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/provider/etcd/schema"
)

// Aggregates. An aggregate whose participants all live in one shard is that
// shard's etcd store's aggregate: its record, the target's capacity and
// every participant in one cluster, prepared and committed each in one Txn,
// as on one cluster. One whose participants live in several shards is the
// two-phase protocol's (package twophase; Config.RefuseCrossShardAggregates
// refuses it instead, ErrCrossShardAggregate): its record lives in the
// aggregate ID's coordinator shard (CoordinatorOf), its participant rows are
// locked while its commit decides, and any store instance finishes it.
//
// A fence names no participant, so CommitAggregate and AbortAggregate find
// the record: the shard this store prepared it in (remembered), else every
// shard's record key read in parallel; the coordinator shard (through the
// protocol, which also finishes an aggregate of one shard there) when no
// other shard holds it.

// PrepareAggregate checks the participants and reserves the target's
// capacity: in the participants' shard when they share one, else with the
// two-phase protocol.
func (s *Store) PrepareAggregate(ctx context.Context, req authority.AggregatePrepareRequest) (authority.PrepareAggregateResult, error) {
	if err := authority.ValidateAggregatePrepare(req); err != nil {
		return authority.PrepareAggregateResult{}, err
	}
	if err := s.begin(ctx); err != nil {
		return authority.PrepareAggregateResult{}, err
	}
	var res authority.PrepareAggregateResult
	err := s.rerouted(ctx, func(t *topology) (err error) {
		res, err = s.prepareAt(ctx, t, req)
		return err
	})
	return res, err
}

// prepareAt prepares req under the map t.
func (s *Store) prepareAt(ctx context.Context, t *topology, req authority.AggregatePrepareRequest) (authority.PrepareAggregateResult, error) {
	if len(t.shards) == 1 {
		res, err := t.shards[0].store.PrepareAggregate(t.at(ctx, 0), req)
		return res, inShard(0, err)
	}
	byShard := map[int][]authority.Key{}
	for _, p := range req.Participants {
		i := t.shardOf(p.AuthorityKey)
		byShard[i] = append(byShard[i], p.AuthorityKey)
		if err := t.refuse(p.AuthorityKey, i); err != nil {
			return authority.PrepareAggregateResult{}, err
		}
	}
	raw := t.num.aggregateRequest(req, t.shardOf)
	// the record's shard: the coordinator shard of an aggregate across
	// shards, the participants' shard of one of a shard
	record := t.coordinatorOf(req.AggregateID)
	if len(byShard) == 1 {
		for i := range byShard {
			record = i
		}
	} else if s.cfg.RefuseCrossShardAggregates {
		return authority.PrepareAggregateResult{}, crossShard(req.AggregateID, byShard)
	}
	// one fence, one record: a fence recorded in another shard is another
	// request's
	elsewhere, err := s.recordedIn(ctx, t, req.Fence(), record)
	if err != nil {
		return authority.PrepareAggregateResult{}, err
	}
	if len(elsewhere) > 0 {
		return authority.PrepareAggregateResult{Kind: authority.KindConflict}, nil
	}
	var res authority.PrepareAggregateResult
	if len(byShard) > 1 {
		res, err = t.coord.PrepareAggregate(ctx, raw)
	} else {
		res, err = t.shards[record].store.PrepareAggregate(t.at(ctx, record), raw)
		err = inShard(record, err)
	}
	if err == nil && (res.Kind == authority.KindPrepared || res.Kind == authority.KindAlreadyPrepared) {
		s.aggs.put(req.Fence(), shardID(t.shards[record]))
	}
	return res, err
}

// CoordinatorOf returns the coordinator shard of the aggregate aggregateID
// under the map in force: the shard holding the record of its aggregates
// across shards (a hash of the ID over the map's home shards, so a
// resharding that grows the map does not change it).
func (s *Store) CoordinatorOf(aggregateID string) int {
	return s.topo.Load().coordinatorOf(aggregateID)
}

// CommitAggregate applies every participant or none: in the shard that
// holds the aggregate's record, or with the two-phase protocol. While that
// shard is frozen by a resharding's switch it waits for it (ErrMoving).
func (s *Store) CommitAggregate(ctx context.Context, fence authority.Fence) (authority.CommitAggregateResult, error) {
	tokens := func(t *topology, res authority.CommitAggregateResult, err error) (authority.CommitAggregateResult, error) {
		if err == nil {
			res.OwnershipTokens, err = t.num.tokens(res.OwnershipTokens, t.shardOf)
		}
		return res, err
	}
	return decide(ctx, s, fence, "commit",
		func(t *topology) (authority.CommitAggregateResult, error) {
			res, err := t.coord.CommitAggregate(ctx, fence)
			return tokens(t, res, err)
		},
		func(t *topology, i int) (authority.CommitAggregateResult, error) {
			var res authority.CommitAggregateResult
			// its rows may be locked by an aggregate across shards
			err := inShard(i, t.retry(t.at(ctx, i), func(ctx context.Context) (err error) {
				res, err = t.shards[i].store.CommitAggregate(ctx, fence)
				return err
			}))
			return tokens(t, res, err)
		})
}

// AbortAggregate releases a prepared aggregate's capacity: in the shard
// that holds its record, or with the two-phase protocol (waiting for a
// resharding's switch, as CommitAggregate).
func (s *Store) AbortAggregate(ctx context.Context, fence authority.Fence) (authority.AbortAggregateResult, error) {
	return decide(ctx, s, fence, "abort",
		func(t *topology) (authority.AbortAggregateResult, error) { return t.coord.AbortAggregate(ctx, fence) },
		func(t *topology, i int) (authority.AbortAggregateResult, error) {
			res, err := t.shards[i].store.AbortAggregate(t.at(ctx, i), fence)
			return res, inShard(i, err)
		})
}

// decide routes the commit or abort (what) of fence under the map in
// force, routed again when it moves: refused while the shard holding the
// record is frozen by a resharding's switch, through the two-phase
// protocol when that is the coordinator shard (protocol), else in that
// shard alone (one).
func decide[R any](ctx context.Context, s *Store, fence authority.Fence, what string,
	protocol func(*topology) (R, error), one func(*topology, int) (R, error)) (R, error) {
	var res R
	if err := authority.ValidateFence(fence); err != nil {
		return res, err
	}
	if err := s.begin(ctx); err != nil {
		return res, err
	}
	err := s.rerouted(ctx, func(t *topology) error {
		i, err := s.locate(ctx, t, fence)
		switch {
		case err != nil:
			return err
		case t.switching(i):
			return t.refuseFrozen("An aggregate's " + what)
		case t.viaProtocol(fence, i):
			res, err = protocol(t)
		default:
			res, err = one(t, i)
		}
		return err
	})
	return res, err
}

// viaProtocol reports whether the record of fence, in shard i, is the
// two-phase protocol's to finish: its coordinator shard's (where an
// aggregate across shards, or of that shard alone, is recorded).
func (t *topology) viaProtocol(fence authority.Fence, i int) bool {
	return t.coord != nil && i == t.coordinatorOf(fence.AggregateID)
}

// locate returns the shard of t holding fence's record: the coordinator
// shard when none holds it. A fence recorded in two shards (two prepares of
// one fence with different participants racing on different shards) is
// ErrCorrupt naming them: neither can be chosen.
func (s *Store) locate(ctx context.Context, t *topology, fence authority.Fence) (int, error) {
	if len(t.shards) == 1 {
		return 0, nil
	}
	if id, ok := s.aggs.get(fence); ok {
		if i := slices.IndexFunc(t.shards, func(sh *shard) bool { return shardID(sh) == id }); i >= 0 {
			return i, nil
		}
	}
	found, err := s.recordedIn(ctx, t, fence, -1)
	if err != nil {
		return 0, err
	}
	switch len(found) {
	case 0:
		return t.coordinatorOf(fence.AggregateID), nil
	case 1:
		s.aggs.put(fence, shardID(t.shards[found[0]]))
		return found[0], nil
	}
	return 0, authority.Wrap(authority.ErrCorrupt, fmt.Sprintf(
		"Aggregate %q generation %d is recorded in shards %v: two prepares of one fence with different participants.",
		fence.AggregateID, fence.AggregateGeneration, found), nil)
}

// recordedIn returns the shards other than skip whose namespace holds
// fence's record, ascending.
func (s *Store) recordedIn(ctx context.Context, t *topology, fence authority.Fence, skip int) ([]int, error) {
	var mu sync.Mutex
	var found []int
	var others []int
	for i := range t.shards {
		if i != skip {
			others = append(others, i)
		}
	}
	err := s.eachOf(ctx, t, others, func(ctx context.Context, i int, sh *shard) error {
		ok, err := sh.store.HasAggregate(t.at(ctx, i), fence)
		if ok {
			mu.Lock()
			found = append(found, i)
			mu.Unlock()
		}
		return err
	})
	slices.Sort(found)
	return found, err
}

func sortedShards(byShard map[int][]authority.Key) []int {
	out := make([]int, 0, len(byShard))
	for i := range byShard {
		out = append(out, i)
	}
	slices.Sort(out)
	return out
}

// crossShard is the refusal of an aggregate whose participants span shards
// (Config.RefuseCrossShardAggregates).
func crossShard(id string, byShard map[int][]authority.Key) error {
	parts := make([]string, 0, len(byShard))
	for _, i := range sortedShards(byShard) {
		keys := byShard[i]
		parts = append(parts, fmt.Sprintf("shard %d: %s", i, strings.Join(keysText(keys), ", ")))
	}
	return authority.Wrap(authority.ErrInvalidArgument, fmt.Sprintf(
		"Aggregate %q has participants in shards %v (%s): this store refuses aggregates across shards (Config.RefuseCrossShardAggregates).",
		id, sortedShards(byShard), strings.Join(parts, "; ")), ErrCrossShardAggregate)
}

func keysText(keys []authority.Key) []string {
	out := make([]string, 0, min(len(keys), 4))
	for i, k := range keys {
		if i == 3 && len(keys) > 4 {
			out = append(out, fmt.Sprintf("and %d more", len(keys)-3))
			break
		}
		out = append(out, string(k))
	}
	return out
}

// fenceCache remembers, for the aggregates this store prepared or found,
// the shard holding their record, bounded: the oldest entries go first,
// and an entry is forgotten after ttl (less than the records' retention:
// once a record expired its fence may be prepared again, in another
// shard).
type fenceCache struct {
	mu    sync.Mutex
	max   int
	ttl   time.Duration
	m     map[authority.Fence]fenceEntry
	order []authority.Fence
}

type fenceEntry struct {
	shard schema.ShardMapShard // the cluster: an index would change meaning with the map
	at    time.Time
}

func newFenceCache(n int, ttl time.Duration) *fenceCache {
	return &fenceCache{max: n, ttl: ttl, m: map[authority.Fence]fenceEntry{}}
}

func (c *fenceCache) get(f authority.Fence) (schema.ShardMapShard, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[f]
	if !ok || time.Since(e.at) > c.ttl {
		return schema.ShardMapShard{}, false
	}
	return e.shard, true
}

func (c *fenceCache) put(f authority.Fence, shard schema.ShardMapShard) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[f]; ok {
		return
	}
	if len(c.order) == c.max {
		delete(c.m, c.order[0])
		c.order = c.order[1:]
	}
	c.m[f] = fenceEntry{shard: shard, at: time.Now()}
	c.order = append(c.order, f)
}
