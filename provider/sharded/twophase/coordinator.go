package twophase

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"sync"

	authority "github.com/zlink-systems/authority"
	etcd "github.com/zlink-systems/authority/provider/etcd"
)

// maxRounds bounds every retry loop of the protocol (a record that keeps
// changing, locks that keep appearing): past it an operation gives up with
// ErrUnavailable.
const maxRounds = 16

// Coordinator runs the protocol over a fixed set of shards. It holds no
// state of its own between calls: any number of coordinators (in any number
// of processes) may run over the same shards, each finishing what another
// left.
type Coordinator struct {
	shards []Shard
	router Router
}

// New returns a coordinator over shards, routed by router (whose indexes
// are positions in shards).
func New(shards []Shard, router Router) (*Coordinator, error) {
	if len(shards) == 0 || router == nil || slices.Contains(shards, nil) {
		return nil, authority.Invalid("twophase.New needs at least one shard, no nil shard and a router")
	}
	return &Coordinator{shards: slices.Clone(shards), router: router}, nil
}

// shard returns the shard at i, which the router returned for what.
func (c *Coordinator) shard(i int, what string) (Shard, error) {
	if i < 0 || i >= len(c.shards) {
		return nil, authority.Invalid(fmt.Sprintf("the router put %s in shard %d, outside the %d shards", what, i, len(c.shards)))
	}
	return c.shards[i], nil
}

// coordinator returns the coordinator shard of aggregateID.
func (c *Coordinator) coordinator(aggregateID string) (Shard, int, error) {
	i := c.router.CoordinatorOf(aggregateID)
	s, err := c.shard(i, "aggregate "+aggregateID)
	return s, i, err
}

// groups returns req's participant keys by shard (keys in request order),
// and the shard indexes in ascending order.
func (c *Coordinator) groups(req *authority.AggregatePrepareRequest) (map[int][]authority.Key, []int, error) {
	by := map[int][]authority.Key{}
	for _, p := range req.Participants {
		i := c.router.ShardOf(p.AuthorityKey)
		if _, err := c.shard(i, "key "+string(p.AuthorityKey)); err != nil {
			return nil, nil, err
		}
		by[i] = append(by[i], p.AuthorityKey)
	}
	order := make([]int, 0, len(by))
	for i := range by {
		order = append(order, i)
	}
	slices.Sort(order)
	return by, order, nil
}

// eachShard runs fn for every shard of order at once and returns the
// first error (by shard order); it returns when every call has.
func eachShard(order []int, fn func(i int) error) error {
	errs := make([]error, len(order))
	var wg sync.WaitGroup
	for j, i := range order {
		wg.Go(func() { errs[j] = fn(i) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// newID returns a random attempt ID (as etcd.LockAttempt wants it).
func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

// PrepareAggregate prepares req: in its coordinator shard as a store of one
// cluster does when every participant lives there, else across shards (the
// participant shards check their rows, the coordinator shard writes the
// record and reserves its part of the target's capacity, then every other
// participant shard reserves its own: parts.go). The answers are the
// contract's.
func (c *Coordinator) PrepareAggregate(ctx context.Context, req authority.AggregatePrepareRequest) (authority.PrepareAggregateResult, error) {
	if err := authority.ValidateAggregatePrepare(req); err != nil {
		return authority.PrepareAggregateResult{}, err
	}
	cs, ci, err := c.coordinator(req.AggregateID)
	if err != nil {
		return authority.PrepareAggregateResult{}, err
	}
	by, order, err := c.groups(&req)
	if err != nil {
		return authority.PrepareAggregateResult{}, err
	}
	if len(order) == 1 && order[0] == ci {
		return cs.PrepareAggregate(ctx, req)
	}
	checks := make([][]etcd.ParticipantCheck, len(c.shards))
	others := slices.DeleteFunc(slices.Clone(order), func(i int) bool { return i == ci })
	err = eachShard(others, func(i int) error {
		var err error
		checks[i], err = c.shards[i].CheckParticipants(ctx, by[i])
		return err
	})
	if err != nil {
		return authority.PrepareAggregateResult{}, err
	}
	res, err := cs.PrepareCrossShard(ctx, req, slices.Concat(checks...))
	if err != nil || res.Kind != authority.KindPrepared && res.Kind != authority.KindAlreadyPrepared {
		return res, err
	}
	return c.prepared(ctx, cs, ci, res)
}
