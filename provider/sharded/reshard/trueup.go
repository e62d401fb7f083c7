package reshard

import (
	"context"
	"fmt"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/sharded/escrow"
)

// The first growth's true-up (provider/sharded/escrow doc, "Resharding").
// Over one cluster a store without capacity escrow (one opened without
// Spares, or by an earlier build) admits placements on the cluster's usage
// alone: capacity it placed may lie beyond the node's budget slice there.
// Over one shard that is harmless (a grow there asks for the slice's lack
// next to all that usage, so the ledger's policy decides on it), but once
// the map has two shards, a grow in the other one would not count it.
// Before the switch puts the grown map in force anywhere, once the source
// is frozen (every write routed before failed its map fence; a store that
// cannot follow the move, without Spares, cannot route again), the job
// covers each node lifecycle's usage in the source beyond its slice:
// the ledger (shard 0 for a namespace of one cluster) gives the slice that
// lack without asking the policy, which admitted that usage when it was
// placed. A store running escrow that grows the slice at the same time
// covers it too: counted twice, only above the truth, until a reclaim.

// trueUp covers every node lifecycle's usage beyond its slice in the
// source of a growth from one shard (nothing for a growth of several:
// every store writing there runs escrow).
func (j *job) trueUp(ctx context.Context) error {
	if len(j.srcs) != 1 {
		return nil
	}
	j.at("covering capacity placed without escrow")
	nodes, err := j.capacityNodes(ctx)
	if err != nil {
		return err
	}
	for _, nl := range nodes {
		if err := j.coverSource(ctx, nl.node, nl.lifecycle); err != nil {
			return fmt.Errorf("covering node %s/%s@%d in shard 0: %w", nl.node.MeshName, nl.node.RID, nl.lifecycle, err)
		}
	}
	return nil
}

type nodeLifecycle struct {
	node      authority.NodeDescriptor
	lifecycle int64
}

// capacityNodes lists the node lifecycles holding capacity in the source
// (in key order).
func (j *job) capacityNodes(ctx context.Context) ([]nodeLifecycle, error) {
	s := j.srcs[0]
	var out []nodeLifecycle
	seen := map[nodeLifecycle]bool{}
	err := listAll(ctx, s, schema.SegCapacity+"/", func(kvs []*kvT) error {
		for _, kv := range kvs {
			e, err := schema.DecodeEntry(s.Namespace(), kv)
			if err != nil || e.Kind != schema.EntryCapacity {
				return authority.Wrap(authority.ErrCorrupt, fmt.Sprintf("shard 0: capacity entry %s", kv.Key), err)
			}
			nl := nodeLifecycle{e.Node, e.Lifecycle}
			if !seen[nl] {
				seen[nl] = true
				out = append(out, nl)
			}
		}
		return nil
	})
	return out, err
}

// coverSource gives shard 0's slice of a node lifecycle what it lacks for
// the usage there: first the ledger's figure for it (a grant whose receipt
// was lost), then a grant of the rest.
func (j *job) coverSource(ctx context.Context, node authority.NodeDescriptor, lifecycle int64) error {
	home := j.shardStore(escrow.HomeOf(node, j.rec.Move.To)).Budget()
	src := j.srcs[0].Budget()
	led, err := home.Ledger(ctx, node, lifecycle)
	if err != nil {
		return err
	}
	if given := led.Shards[0].Given; !given.IsZero() {
		if _, err := src.Receive(ctx, node, lifecycle, given); err != nil {
			return err
		}
	}
	st, err := src.Slice(ctx, node, lifecycle)
	if err != nil {
		return err
	}
	lack := st.Usage.Minus(st.Slice.Size()).Positive()
	if lack.IsZero() {
		return nil
	}
	for _, c := range capacitiesOf(lack) {
		if led, err = home.Grant(ctx, node, lifecycle, 0, c); err != nil {
			return err
		}
	}
	_, err = src.Receive(ctx, node, lifecycle, led.Shards[0].Given)
	return err
}
