package reshard

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"

	authority "github.com/zlink-systems/authority"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/sharded/escrow"
)

// Capacity budgets follow the moved rows (provider/sharded/escrow doc,
// "Resharding"). Between the switch and the cleanup a moved row's capacity
// entry is in its source (a stale copy, covered by the source's budget
// slice) and in the new cluster (where no slice holds it yet): counted
// twice, never under. Before a source drops its stale entries, the new
// cluster's slice of each node lifecycle is covered: the ledger (in the
// node's home shard, which a resharding keeps) gives it what its usage
// lacks, at most what the sources' stale entries hold, without asking the
// policy (the job's stores have none: budget the sources return at once).
// Then each source deletes its stale entries and returns their budget from
// its slice in the same Txn (etcd Moves.DeleteMovedCapacity), so the
// budget never shows as slack there, and the ledger is credited: the
// node's Granted is back to what it was, the new cluster's slice holding
// the moved rows' part.

// movedNode is one node lifecycle's stale capacity entries in the sources.
type movedNode struct {
	node      authority.NodeDescriptor
	lifecycle int64
	rels      [][]string    // by source, relative keys
	stale     schema.Budget // the capacity they hold, all sources
}

// movedCapacity lists the capacity entries of moved rows left in every
// source, by node lifecycle (in key order).
func (j *job) movedCapacity(ctx context.Context) ([]*movedNode, error) {
	byEpoch := map[string]*movedNode{}
	var order []string
	for i, s := range j.srcs {
		err := listAll(ctx, s, schema.SegCapacity+"/", func(kvs []*kvT) error {
			for _, kv := range kvs {
				c, ok := j.moving(i, kv, false)
				_, _, epoch := s.Moves().KindOf(string(kv.Key))
				if !ok || epoch == "" {
					continue
				}
				e, err := schema.DecodeEntry(s.Namespace(), kv)
				if err != nil || e.Capacity == nil {
					return authority.Wrap(authority.ErrCorrupt, fmt.Sprintf("shard %d: capacity entry %s", i, kv.Key), err)
				}
				mn := byEpoch[epoch]
				if mn == nil {
					mn = &movedNode{node: e.Node, lifecycle: e.Lifecycle, rels: make([][]string, len(j.srcs)), stale: schema.Budget{}}
					byEpoch[epoch] = mn
					order = append(order, epoch)
				}
				mn.rels[i] = append(mn.rels[i], c.rel)
				mn.stale = mn.stale.Plus(schema.BudgetOf(e.Capacity.Vector))
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("shard %d: %w", i, err)
		}
	}
	slices.Sort(order)
	out := make([]*movedNode, len(order))
	for k, e := range order {
		out[k] = byEpoch[e]
	}
	return out, nil
}

// shardStore returns the store of shard i of the next map.
func (j *job) shardStore(i int) *etcdstore.Store {
	if i == len(j.srcs) {
		return j.dst
	}
	return j.srcs[i]
}

// coverNew gives the new cluster's slice of mn what its usage lacks, at
// most mn.stale: first the ledger's figure for it (a cover of an earlier
// run whose receipt was lost), then a grant of the rest.
func (j *job) coverNew(ctx context.Context, mn *movedNode) (schema.Budget, error) {
	n := len(j.srcs)
	home := j.shardStore(escrow.HomeOf(mn.node, j.rec.Move.To)).Budget()
	dst := j.dst.Budget()
	led, err := home.Ledger(ctx, mn.node, mn.lifecycle)
	if err != nil {
		return nil, err
	}
	if given := led.Shards[n].Given; !given.IsZero() {
		if _, err := dst.Receive(ctx, mn.node, mn.lifecycle, given); err != nil {
			return nil, err
		}
	}
	st, err := dst.Slice(ctx, mn.node, mn.lifecycle)
	if err != nil {
		return nil, err
	}
	lack := st.Usage.Minus(st.Slice.Size()).Positive()
	cover := lack.Minus(lack.Minus(mn.stale).Positive()).Positive() // min(lack, stale)
	if cover.IsZero() {
		return cover, nil
	}
	for _, c := range capacitiesOf(cover) {
		if led, err = home.Grant(ctx, mn.node, mn.lifecycle, n, c); err != nil {
			return nil, err
		}
	}
	_, err = dst.Receive(ctx, mn.node, mn.lifecycle, led.Shards[n].Given)
	return cover, err
}

// capacitiesOf are the capacity vectors of a budget, for Grant: one per
// Spot type (the first with the actor and Spot counts).
func capacitiesOf(b schema.Budget) []authority.CapacityVector {
	var first authority.CapacityVector
	var out []authority.CapacityVector
	for _, counter := range slices.SortedFunc(maps.Keys(b), func(x, y schema.BudgetCounter) int {
		return cmp.Or(cmp.Compare(x.Kind, y.Kind), cmp.Compare(x.StableType, y.StableType))
	}) {
		switch n := b[counter]; counter.Kind {
		case authority.ObjectActor:
			first.Actors = n
		case authority.CounterSpots:
			first.Spots = n
		default:
			st := &authority.SpotTypeCapacity{ObjectKind: counter.Kind, StableType: counter.StableType, Count: n}
			if first.SpotType == nil {
				first.SpotType = st
			} else {
				out = append(out, authority.CapacityVector{SpotType: st})
			}
		}
	}
	return append([]authority.CapacityVector{first}, out...)
}

// returnMoved deletes mn's stale entries from every source, returning
// their budget from the source's slice in the same Txn, and credits the
// ledger with what each source returned.
func (j *job) returnMoved(ctx context.Context, mn *movedNode, mapRevs []int64) error {
	home := j.shardStore(escrow.HomeOf(mn.node, j.rec.Move.To)).Budget()
	for i, rels := range mn.rels {
		returned := false
		for len(rels) > 0 {
			k := min(len(rels), j.cfg.Batch)
			ret, ok, err := j.srcs[i].Moves().DeleteMovedCapacity(ctx, mapRevs[i], mn.node, mn.lifecycle, rels[:k])
			if err != nil {
				return fmt.Errorf("shard %d: %w", i, err)
			}
			if !ok {
				return fmt.Errorf("%w: shard %d's map moved while its moved keys were deleted", ErrOtherMove, i)
			}
			returned = returned || !ret.IsZero()
			rels = rels[k:]
		}
		if !returned {
			continue
		}
		st, err := j.srcs[i].Budget().Slice(ctx, mn.node, mn.lifecycle)
		if err != nil {
			return fmt.Errorf("shard %d: %w", i, err)
		}
		if _, err := home.Credit(ctx, mn.node, mn.lifecycle, i, st.Slice.Returned); err != nil {
			return fmt.Errorf("shard %d: %w", i, err)
		}
	}
	return nil
}

// moveBudgets covers the new cluster's slices and then deletes the moved
// capacity entries from the sources, returning their budget (the cleanup's
// last step, after the moved rows and owner index entries are gone, so
// nothing but this step deletes a stale entry).
func (j *job) moveBudgets(ctx context.Context, mapRevs []int64) error {
	j.at("moving the capacity budgets of the moved rows")
	nodes, err := j.movedCapacity(ctx)
	if err != nil {
		return err
	}
	for _, mn := range nodes {
		if _, err := j.coverNew(ctx, mn); err != nil {
			return fmt.Errorf("covering node %s/%s@%d in the new cluster: %w", mn.node.MeshName, mn.node.RID, mn.lifecycle, err)
		}
		if err := j.returnMoved(ctx, mn, mapRevs); err != nil {
			return fmt.Errorf("node %s/%s@%d: %w", mn.node.MeshName, mn.node.RID, mn.lifecycle, err)
		}
	}
	return nil
}
