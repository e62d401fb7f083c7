package etcd

import (
	"cmp"
	"context"
	"errors"

	"github.com/zlink-systems/authority/internal/etcdpage"
	"github.com/zlink-systems/authority/provider/etcd/internal/txnkit"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// pruneCapacityEpochs deletes the capacity epoch of every node lifecycle
// that holds no capacity entry, and returns how many it deleted.
//
// Every Txn that changes a capacity entry puts its node lifecycle's epoch,
// so without pruning one epoch key stays behind for every node lifecycle
// that ever held capacity: a cluster whose nodes start new lifecycles
// gathers them without bound. A deleted epoch costs nothing: the
// next reservation on that node lifecycle puts it again.
//
// Each delete is fenced, in the same Txn, on the node's capacity range
// being empty, so an epoch whose node gained an entry since the listing
// stays. Pruning is safe at any time, next to running stores: a reservation
// decided on the usage read before an epoch was deleted fails its fence
// (an equality on the epoch's ModRevision, see fenceCapacity) and decides
// again. Every process writing the namespace must run a version with that
// fence (this one and later).
//
// Each page of epochs costs one read Txn, which looks at most one key of
// each node's capacity range, and, when some of those ranges were empty, one
// write Txn holding a nested Txn per empty-looking epoch (at most
// --max-txn-ops - 1: etcd gives each nested Txn what the outer one leaves
// of that budget). A run that finds nothing to prune writes nothing. A key
// under capacity-epochs/ that names no node lifecycle is left alone and
// reported (ErrCorrupt) once the rest is pruned. It is idempotent: after an
// error (the count says what was deleted before it) run it again.
//
// It also deletes, the same way, every owner directory key
// (storeversion.FewerKeys) whose placement range is empty: one is left
// behind by each owner lease generation whose rows left a node lifecycle
// other than through RemoveAllByOwner or RebindRows. The count includes
// them.
func (s *Store) pruneCapacityEpochs(ctx context.Context) (int, error) {
	if err := s.begin(ctx); err != nil {
		return 0, err
	}
	n, err := s.pruneEmpty(ctx, schema.EntryCapacityEpoch, s.epochNode)
	if err != nil {
		return n, err
	}
	dirs, err := s.pruneEmpty(ctx, schema.EntryOwnerNode, s.ownerNodeRange)
	return n + dirs, err
}

// pruneEmpty deletes every key of kind whose range (rangeOf: the prefix of
// the keys it stands for) is empty, each delete fenced on that in the same
// Txn, and returns how many it deleted (see pruneCapacityEpochs).
func (s *Store) pruneEmpty(ctx context.Context, kind schema.EntryKind, rangeOf func(key string) (string, error)) (int, error) {
	prefix := schema.Prefix(s.keys.Namespace(), kind)
	end := prefixEnd(prefix)
	from := prefix
	pageSize := max(1, s.maxOps-1)
	pruned := 0
	var bad error // the first key that names no node lifecycle
	for {
		rctx, cancel := s.requestContext(ctx)
		page, err := etcdpage.Read(rctx, s.kv, from, end, 0, int64(pageSize), clientv3.WithKeysOnly())
		cancel()
		if err != nil {
			return pruned, mapError(err, false)
		}
		var epochs, nodes []string
		var looks []clientv3.Op
		var ranges []txnkit.RangeRead
		for _, kv := range page.Kvs {
			node, err := rangeOf(string(kv.Key))
			if err != nil {
				bad = cmp.Or(bad, err)
				continue
			}
			epochs, nodes = append(epochs, string(kv.Key)), append(nodes, node)
			var h txnkit.RangeRead
			looks, h = txnkit.AddRead(looks, clientv3.OpGet(node, clientv3.WithRange(prefixEnd(node)), clientv3.WithLimit(1), clientv3.WithKeysOnly()))
			ranges = append(ranges, h)
		}
		if len(looks) > 0 {
			held, err := s.read(ctx, looks...)
			if err != nil {
				return pruned, err
			}
			t := &txnkit.Txn{}
			for i, epoch := range epochs {
				if len(ranges[i].In(held).Kvs) > 0 {
					continue // the node holds capacity: its epoch stays
				}
				bytes := 2*len(epoch) + 2*len(nodes[i]) + 3*txnkit.OpOverhead
				if len(t.Then) > 0 && t.Bytes+bytes > s.maxBytes {
					n, err := s.sendPrune(ctx, t, kind)
					if pruned += n; err != nil {
						return pruned, err
					}
					t = &txnkit.Txn{}
				}
				empty := clientv3.Compare(clientv3.CreateRevision(nodes[i]), "=", 0).WithRange(prefixEnd(nodes[i]))
				t.Then = append(t.Then, clientv3.OpTxn([]clientv3.Cmp{empty}, []clientv3.Op{clientv3.OpDelete(epoch)}, nil))
				t.Bytes += bytes
			}
			n, err := s.sendPrune(ctx, t, kind)
			if pruned += n; err != nil {
				return pruned, err
			}
		}
		if !page.More || len(page.Kvs) == 0 {
			return pruned, bad
		}
		from = string(page.Kvs[len(page.Kvs)-1].Key) + "\x00"
	}
}

// sendPrune sends t, a Txn of nested deletes of keys of kind (nothing when
// it holds none), and returns how many it deleted: those whose range was
// still empty.
func (s *Store) sendPrune(ctx context.Context, t *txnkit.Txn, kind schema.EntryKind) (int, error) {
	if len(t.Then) == 0 {
		return 0, nil
	}
	resp, err := s.sendWrite(ctx, t, "pruning "+kind.String()+" keys")
	if err != nil {
		return 0, err
	}
	n := 0
	for _, r := range resp.Responses {
		if sub := r.GetResponseTxn(); sub != nil && sub.Succeeded {
			for _, op := range sub.Responses {
				n += int(op.GetResponseDeleteRange().GetDeleted())
			}
		}
	}
	return n, nil
}

// epochNode returns the capacity range prefix of the node lifecycle whose
// capacity epoch key is epoch, refusing a key that names none.
func (s *Store) epochNode(epoch string) (string, error) {
	e, err := schema.DecodeEntry(s.keys.Namespace(), &mvccpb.KeyValue{Key: []byte(epoch)})
	if err != nil {
		return "", err
	}
	if e.Kind != schema.EntryCapacityEpoch {
		return "", corrupt(epoch, errors.New("not a capacity epoch key"))
	}
	return s.keys.CapacityNode(e.Node, e.Lifecycle), nil
}

// ownerNodeRange returns the placement range of the owner and node
// lifecycle an owner directory key names, refusing a key that names none.
func (s *Store) ownerNodeRange(key string) (string, error) {
	e, err := schema.DecodeEntry(s.keys.Namespace(), &mvccpb.KeyValue{Key: []byte(key)})
	if err != nil {
		return "", err
	}
	if e.Kind != schema.EntryOwnerNode {
		return "", corrupt(key, errors.New("not an owner directory key"))
	}
	return s.keys.PlacementOwnerPrefix(e.Node, e.Lifecycle, e.Owner), nil
}
