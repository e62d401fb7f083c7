package etcd

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	authority "github.com/zlink-systems/authority"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrClusterRegressed reports that the store saw the cluster's revision go
// back, or its cluster ID change: the cluster was restored from a backup
// without `etcdutl snapshot restore --bump-revision … --mark-compacted`, or
// the endpoints now reach another cluster. A StoreVersion seen before could
// then name another row state, so the store refuses every request from then
// on (errors wrap it and authority.ErrUnavailable); open a new store.
var ErrClusterRegressed = errors.New("etcd: the cluster's revision went back or its cluster ID changed (restored from a backup without --bump-revision?); the store refuses every request until it is reopened")

// revisionGuard watches the headers of the store's KV responses. Every
// request the store sends is linearizable, so a response to a request sent
// after the store saw revision r carries a revision ≥ r; a lower one means
// the cluster went back in time.
type revisionGuard struct {
	highest atomic.Int64
	cluster atomic.Uint64
	tripped atomic.Pointer[string] // what was seen; nil while healthy
}

// refuse returns the error for a request the guard refuses before sending.
func (g *revisionGuard) refuse() error {
	if why := g.tripped.Load(); why != nil {
		return authority.Wrap(authority.ErrUnavailable, *why, ErrClusterRegressed)
	}
	return nil
}

// observe checks the header of a response to a request sent when the
// highest revision seen was floor; write says whether the request wrote.
func (g *revisionGuard) observe(floor int64, h *pb.ResponseHeader, write bool) error {
	if h == nil {
		return g.refuse()
	}
	if !g.cluster.CompareAndSwap(0, h.ClusterId) && g.cluster.Load() != h.ClusterId {
		g.trip(fmt.Sprintf("etcd answered from cluster %x, the store opened on cluster %x", h.ClusterId, g.cluster.Load()))
	} else if h.Revision < floor {
		g.trip(fmt.Sprintf("etcd answered at revision %d after the store had seen revision %d", h.Revision, floor))
	}
	for {
		cur := g.highest.Load()
		if h.Revision <= cur || g.highest.CompareAndSwap(cur, h.Revision) {
			break
		}
	}
	if why := g.tripped.Load(); why != nil {
		if write { // it reached the server: it may have been applied there
			return authority.Wrap(authority.ErrOutcomeUnknown, *why, ErrClusterRegressed)
		}
		return authority.Wrap(authority.ErrUnavailable, *why, ErrClusterRegressed)
	}
	return nil
}

func (g *revisionGuard) trip(why string) { g.tripped.CompareAndSwap(nil, &why) }

// guardedKV is the store's KV: each call is refused once the guard tripped,
// and each response's header is checked by it.
type guardedKV struct {
	clientv3.KV
	g *revisionGuard
}

func (k guardedKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	if err := k.g.refuse(); err != nil {
		return nil, err
	}
	floor := k.g.highest.Load()
	resp, err := k.KV.Get(ctx, key, opts...)
	if err != nil {
		return nil, err
	}
	return resp, k.g.observe(floor, resp.Header, false)
}

func (k guardedKV) Put(ctx context.Context, key, val string, opts ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	if err := k.g.refuse(); err != nil {
		return nil, err
	}
	floor := k.g.highest.Load()
	resp, err := k.KV.Put(ctx, key, val, opts...)
	if err != nil {
		return nil, err
	}
	return resp, k.g.observe(floor, resp.Header, true)
}

func (k guardedKV) Delete(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.DeleteResponse, error) {
	if err := k.g.refuse(); err != nil {
		return nil, err
	}
	floor := k.g.highest.Load()
	resp, err := k.KV.Delete(ctx, key, opts...)
	if err != nil {
		return nil, err
	}
	return resp, k.g.observe(floor, resp.Header, true)
}

func (k guardedKV) Txn(ctx context.Context) clientv3.Txn {
	return &guardedTxn{Txn: k.KV.Txn(ctx), g: k.g}
}

// guardedTxn checks a Txn's response; a Txn with Then or Else ops counts as
// a write (the store's read-only Txns have no compares and only ranges, but
// telling them apart costs more than the difference is worth).
type guardedTxn struct {
	clientv3.Txn
	g      *revisionGuard
	writes bool
}

func (t *guardedTxn) If(cs ...clientv3.Cmp) clientv3.Txn {
	t.Txn = t.Txn.If(cs...)
	return t
}

func (t *guardedTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.Txn, t.writes = t.Txn.Then(ops...), t.writes || anyWrite(ops)
	return t
}

func (t *guardedTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.Txn, t.writes = t.Txn.Else(ops...), t.writes || anyWrite(ops)
	return t
}

func (t *guardedTxn) Commit() (*clientv3.TxnResponse, error) {
	if err := t.g.refuse(); err != nil {
		return nil, err
	}
	floor := t.g.highest.Load()
	resp, err := t.Txn.Commit()
	if err != nil {
		return nil, err
	}
	return resp, t.g.observe(floor, resp.Header, t.writes)
}

func anyWrite(ops []clientv3.Op) bool {
	for _, op := range ops {
		if op.IsPut() || op.IsDelete() || op.IsTxn() {
			return true
		}
	}
	return false
}
