package etcd

import (
	"context"
	"strings"

	"github.com/zlink-systems/authority/internal/etcdpage"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// PruneCapacityEpochs deletes the capacity epoch of every node lifecycle
// that holds no capacity entry, and returns how many it deleted.
//
// Every Txn that changes a capacity entry puts its node lifecycle's epoch,
// so without pruning one epoch key stays behind for every node lifecycle
// that ever held capacity: a cluster whose nodes restart (a new lifecycle
// each time) gathers them without bound. A deleted epoch costs nothing: the
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
// It sends one Txn per page of epochs (a nested Txn per epoch, as many as
// --max-txn-ops allows). It is idempotent: after an error (the count says
// what was deleted before it) run it again.
func (s *Store) PruneCapacityEpochs(ctx context.Context) (int, error) {
	if err := s.begin(ctx); err != nil {
		return 0, err
	}
	prefix := s.keys.ns + "capacity-epochs/"
	end := prefixEnd(prefix)
	from := prefix
	pruned := 0
	for {
		rctx, cancel := s.requestContext(ctx)
		page, err := etcdpage.Read(rctx, s.kv, from, end, 0, int64(max(1, s.maxOps)), clientv3.WithKeysOnly())
		cancel()
		if err != nil {
			return pruned, mapError(err, false)
		}
		for start := 0; start < len(page.Kvs); {
			t := &txn{}
			n := start
			for ; n < len(page.Kvs); n++ {
				epoch := string(page.Kvs[n].Key)
				node, err := s.epochNode(epoch)
				if err != nil {
					return pruned, err
				}
				bytes := 2*len(epoch) + 2*len(node) + 3*opOverhead
				if n > start && (t.ops() >= s.maxOps || t.bytes+bytes > s.maxBytes) {
					break
				}
				empty := clientv3.Compare(clientv3.CreateRevision(node), "=", 0).WithRange(prefixEnd(node))
				t.then = append(t.then, clientv3.OpTxn([]clientv3.Cmp{empty}, []clientv3.Op{clientv3.OpDelete(epoch)}, nil))
				t.bytes += bytes
			}
			resp, err := s.commit(ctx, t, "pruning capacity epochs")
			if err != nil {
				return pruned, err
			}
			for _, r := range resp.Responses {
				if sub := r.GetResponseTxn(); sub != nil && sub.Succeeded {
					pruned += int(sub.Responses[0].GetResponseDeleteRange().Deleted)
				}
			}
			start = n
		}
		if !page.More || len(page.Kvs) == 0 {
			return pruned, nil
		}
		from = string(page.Kvs[len(page.Kvs)-1].Key) + "\x00"
	}
}

// epochNode returns the capacity range prefix of the node lifecycle whose
// capacity epoch key is epoch, refusing a key that names none.
func (s *Store) epochNode(epoch string) (string, error) {
	rest := strings.TrimPrefix(epoch, s.keys.ns+"capacity-epochs/")
	var e Entry
	if err := e.decodeCapacityEpoch(rest, &mvccpbKV{}); err != nil {
		return "", corrupt(epoch, err)
	}
	return s.keys.capacityNode(e.Node, e.Lifecycle), nil
}
