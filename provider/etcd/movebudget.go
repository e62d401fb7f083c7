package etcd

import (
	"context"
	"fmt"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/provider/etcd/internal/txnkit"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// DeleteMovedCapacity deletes capacity entries of one node lifecycle that a
// resharding moved away from this source (rels, relative keys), once the
// map in force here is at currentRev, and in the same Txn returns the
// budget they held from the node lifecycle's budget slice here: Returned
// grows by the capacity of the entries deleted (at most the slice's size,
// counter by counter; nothing without a slice), and the capacity epoch is
// put. So the slice never holds, as slack, budget of rows that now live in
// another shard: the ledger learns the return through Credit (package
// provider/sharded/escrow). Each entry is deleted only at the ModRevision
// read, so running it again deletes and returns nothing twice. ok false:
// the map is not at currentRev, nothing was deleted. A rel that is not a
// capacity entry of the node lifecycle is refused (ErrInvalidArgument).
func (m *Moves) DeleteMovedCapacity(ctx context.Context, currentRev int64, node authority.NodeDescriptor, lifecycle int64, rels []string) (returned schema.Budget, ok bool, err error) {
	s := m.s
	if err := s.refuseWrite(); err != nil {
		return nil, false, err
	}
	if err := checkNode(node, lifecycle); err != nil {
		return nil, false, err
	}
	keys := make([]string, len(rels))
	for i, r := range rels {
		keys[i] = s.keys.Namespace() + r
		if _, _, epoch := s.keys.MoveKindOf(keys[i]); epoch == "" || s.keys.Namespace()+epoch != s.keys.CapacityEpoch(node, lifecycle) {
			return nil, false, authority.Invalid(fmt.Sprintf("%q is not a capacity entry of node %s/%s@%d.", r, node.MeshName, node.RID, lifecycle))
		}
	}
	for attempt := 0; attempt < maxAttempts; attempt++ {
		t, ret, found, err := m.returnTxn(ctx, currentRev, node, lifecycle, keys)
		switch {
		case err != nil:
			return nil, false, err
		case !found:
			return nil, false, nil // the map moved on
		case t == nil:
			return schema.Budget{}, true, nil // deleted already
		}
		if err := s.check(t, "deleting a resharding's moved capacity entries"); err != nil {
			return nil, false, err
		}
		resp, err := s.send(unfenced(ctx), t)
		if err != nil {
			return nil, false, err
		}
		if resp.Succeeded {
			return ret, true, nil
		}
	}
	return nil, false, contended("returning moved capacity's budget")
}

// returnTxn reads the entries, the slice and the map key at one revision
// and builds DeleteMovedCapacity's Txn (nil: no entry is left). found false:
// the map is not at currentRev.
func (m *Moves) returnTxn(ctx context.Context, currentRev int64, node authority.NodeDescriptor, lifecycle int64, keys []string) (*txnkit.Txn, schema.Budget, bool, error) {
	s := m.s
	sliceKey, epochKey, mapKey := s.keys.BudgetSlice(node, lifecycle), s.keys.CapacityEpoch(node, lifecycle), s.keys.ShardMap()
	ops := []clientv3.Op{opGet(mapKey), opGet(sliceKey)}
	for _, k := range keys {
		ops = append(ops, opGet(k))
	}
	resp, err := s.read(unfenced(ctx), ops...)
	if err != nil {
		return nil, nil, false, err
	}
	if kv := txnkit.KVNamed(resp, mapKey); kv == nil || kv.ModRevision != currentRev {
		return nil, nil, false, nil
	}
	var slice schema.BudgetSlice
	var sliceRev int64
	if kv := txnkit.KVNamed(resp, sliceKey); kv != nil {
		if slice, err = schema.DecodeBudgetSlice(kv); err != nil {
			return nil, nil, false, err
		}
		sliceRev = kv.ModRevision
	}
	t := &txnkit.Txn{Alone: true}
	t.Cmp(modRevIs(mapKey, currentRev))
	t.Cmp(modRevIs(sliceKey, sliceRev))
	held := schema.Budget{}
	for _, k := range keys {
		kv := txnkit.KVNamed(resp, k)
		if kv == nil {
			continue
		}
		_, vec, err := schema.DecodeCapacityEntry(kv.Value)
		if err != nil {
			return nil, nil, false, authority.Wrap(authority.ErrCorrupt, "capacity entry "+k, err)
		}
		held = held.Plus(schema.BudgetOf(vec))
		t.Cmp(modRevIs(k, kv.ModRevision))
		t.Del(k)
	}
	if len(t.Then) == 0 {
		return nil, nil, true, nil
	}
	t.Touch(epochKey)
	// what the slice can give back of it: a slice short of its usage (the
	// entries were admitted without escrow) returns what it has
	ret := held.Minus(held.Minus(slice.Size().Positive()).Positive())
	if !ret.IsZero() {
		t.Put(sliceKey, schema.BudgetSlice{Received: slice.Received, Returned: slice.Returned.Plus(ret)}.Encode())
	}
	return t, ret, true, nil
}
