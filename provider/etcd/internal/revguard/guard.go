// Package revguard is the etcd store's revision-regression guard: it checks
// the header of every KV response for a revision going back or a cluster ID
// changing (a cluster restored from a snapshot, or another cluster behind the
// endpoints), and from the first regression on refuses every request. The
// store's KV is Guard.KV of its client's; see etcd.ErrClusterRegressed for
// what callers see.
package revguard

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	authority "github.com/zlink-systems/authority"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
)

// ErrClusterRegressed is what every error of the guard wraps: the cluster
// went back in time or is another cluster. The store exports it as
// etcd.ErrClusterRegressed, which documents what callers see.
var ErrClusterRegressed = errors.New("etcd: the cluster's revision went back or its cluster ID changed (restored from a snapshot?)")

// Guard watches the header of every KV response for a revision
// going back or a cluster ID changing. Its cost is two atomic loads before
// and a compare (and rarely a compare-and-swap) after each request.
//
// Every KV request of the store is linearizable (no serializable reads), so
// its response's revision is at least that of every response received before
// it was sent: the check compares with the highest revision seen when the
// request was sent (its floor), not when its response arrives, since a read
// answered just before a concurrent write may arrive after it.
type Guard struct {
	maxRev  atomic.Int64
	cluster atomic.Uint64 // 0: none seen yet
	once    sync.Once
	err     atomic.Pointer[error] // the first regression seen
	done    chan struct{}         // closed at the first regression

	// A write is the first request that can do harm in a restored cluster,
	// and its own response shows the regression only after it was applied.
	// So after the client's connection changed state (a restore stops every
	// member, which breaks it), the next write first sends a probe read
	// (probeKey, count only) and is sent only if the probe's header passes.
	// changes counts the state changes seen, verified the count a probe
	// passed at.
	changes  atomic.Int64
	verified atomic.Int64
	// endpoints returns the client's endpoints (nil: not followed): a write
	// after they changed (Client.SetEndpoints, which can move the connection
	// to another cluster without the connection's state ever leaving Ready)
	// is probed too. lastEndpoints is their value at the last write.
	endpoints     func() []string
	lastEndpoints atomic.Pointer[string]
	probeKey      string
	mapRead       func(error) error
	stop          context.CancelFunc
	wg            sync.WaitGroup
}

// New returns a guard whose probe before a write reads probeKey (count
// only); mapRead types the error of a failed probe read as the store types a
// failed read.
func New(probeKey string, mapRead func(error) error) *Guard {
	return &Guard{done: make(chan struct{}), probeKey: probeKey, mapRead: mapRead, stop: func() {}}
}

// Follow has the guard probe before the first write after endpoints'
// answer changed.
func (g *Guard) Follow(endpoints func() []string) {
	g.endpoints = endpoints
	joined := strings.Join(endpoints(), ",")
	g.lastEndpoints.Store(&joined)
}

// endpointsMoved counts a change of the client's endpoints as a state change.
func (g *Guard) endpointsMoved() {
	if g.endpoints == nil {
		return
	}
	joined := strings.Join(g.endpoints(), ",")
	if last := g.lastEndpoints.Load(); last != nil && *last == joined {
		return
	}
	g.lastEndpoints.Store(&joined)
	g.changes.Add(1)
}

// Watch counts the state changes of conn until Close.
func (g *Guard) Watch(conn *grpc.ClientConn) {
	if conn == nil {
		return
	}
	ctx, stop := context.WithCancel(context.Background())
	g.stop = stop
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		st := conn.GetState()
		if st != connectivity.Ready {
			g.changes.Add(1)
		}
		for conn.WaitForStateChange(ctx, st) {
			g.changes.Add(1) // even when it is Ready again by now
			st = conn.GetState()
		}
	}()
}

// Close stops Watch.
func (g *Guard) Close() {
	g.stop()
	g.wg.Wait()
}

// verify sends the probe read before a write when the connection changed
// state since the last probe passed. An error means the write must not be
// sent.
func (g *Guard) verify(ctx context.Context, kv clientv3.KV) error {
	if err := g.refused(); err != nil {
		return err
	}
	g.endpointsMoved()
	seen := g.changes.Load()
	if g.verified.Load() >= seen {
		return nil
	}
	floor := g.Floor()
	r, err := kv.Get(ctx, g.probeKey, clientv3.WithCountOnly())
	if err != nil {
		// typed here: the store's error mapping would report it as a
		// write's unknown outcome
		return guardError{authority.Wrap(authority.ErrUnavailable, "etcd probe read before a write failed; the write was not sent", g.mapRead(err))}
	}
	if err := g.observe(floor, r.Header, false); err != nil {
		return err
	}
	for cur := g.verified.Load(); cur < seen && !g.verified.CompareAndSwap(cur, seen); cur = g.verified.Load() {
	}
	return nil
}

// refused returns the error every request gets after a regression (nil
// before one).
func (g *Guard) refused() error {
	if p := g.err.Load(); p != nil {
		return authority.Wrap(authority.ErrUnavailable, "etcd store refuses every request since "+(*p).Error()+"; close it and open a new store", ErrClusterRegressed)
	}
	return nil
}

// Regressed is closed at the first regression.
func (g *Guard) Regressed() <-chan struct{} { return g.done }

// Floor is the highest revision seen so far: the least revision a
// linearizable response to a request sent now may carry.
func (g *Guard) Floor() int64 { return g.maxRev.Load() }

// observe checks the header of a response to a request sent at floor. It
// returns nil, or the error for that request when the header shows a
// regression (write: the request could have changed something).
func (g *Guard) observe(floor int64, h *pb.ResponseHeader, write bool) error {
	if h == nil {
		return nil
	}
	if err := g.ObserveCluster(h); err != nil {
		return g.answer(err, write)
	}
	if h.Revision < floor {
		return g.answer(g.trip(fmt.Sprintf("a response carried revision %d after revision %d had been seen", h.Revision, floor)), write)
	}
	for cur := g.maxRev.Load(); h.Revision > cur && !g.maxRev.CompareAndSwap(cur, h.Revision); cur = g.maxRev.Load() {
	}
	return nil
}

// ObserveCluster checks only the cluster ID of h (for responses whose
// revision is not linearizable, such as lease renewals). It returns the
// regression it finds, nil otherwise.
func (g *Guard) ObserveCluster(h *pb.ResponseHeader) error {
	if h == nil || h.ClusterId == 0 {
		return nil
	}
	if g.cluster.CompareAndSwap(0, h.ClusterId) {
		return nil
	}
	if seen := g.cluster.Load(); seen != h.ClusterId {
		return g.trip(fmt.Sprintf("a response came from cluster %x, not from cluster %x", h.ClusterId, seen))
	}
	return nil
}

// trip records the first regression and returns its description.
func (g *Guard) trip(what string) error {
	err := errors.New(what)
	g.once.Do(func() {
		g.err.Store(&err)
		close(g.done)
	})
	return err
}

func (g *Guard) answer(cause error, write bool) error {
	if write {
		return authority.Wrap(authority.ErrOutcomeUnknown,
			"etcd write was answered by a cluster that went back in time or changed ("+cause.Error()+"): it may have been applied there; close the store and open a new one", ErrClusterRegressed)
	}
	return authority.Wrap(authority.ErrUnavailable,
		"etcd read was answered by a cluster that went back in time or changed ("+cause.Error()+"); close the store and open a new one", ErrClusterRegressed)
}

// guardError is an error of the guard that the store passes on as it is
// (Typed).
type guardError struct{ error }

func (e guardError) Unwrap() error { return e.error }

// Typed returns the typed error inside err when the guard made err and
// typed it already (a failed probe read), so that the store's error mapping
// passes it on as it is.
func Typed(err error) (error, bool) {
	var ge guardError
	if errors.As(err, &ge) {
		return ge.error, true
	}
	return nil, false
}

// ClusterID returns the ID of the cluster of the first response the guard
// checked (0: none yet).
func (g *Guard) ClusterID() uint64 { return g.cluster.Load() }

// KV returns kv with every request passing the guard: refused after a
// regression, a write probed first after a connection change, each response
// checked.
func (g *Guard) KV(kv clientv3.KV) clientv3.KV { return guardedKV{kv: kv, g: g} }

// guardedKV is the store's KV: every request passes its guard.
type guardedKV struct {
	kv clientv3.KV
	g  *Guard
}

func (k guardedKV) Put(ctx context.Context, key, val string, opts ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	floor, err := k.before(ctx, true)
	if err != nil {
		return nil, err
	}
	r, err := k.kv.Put(ctx, key, val, opts...)
	if err != nil {
		return nil, err
	}
	return r, k.g.observe(floor, r.Header, true)
}

func (k guardedKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	floor, err := k.before(ctx, false)
	if err != nil {
		return nil, err
	}
	r, err := k.kv.Get(ctx, key, opts...)
	if err != nil {
		return nil, err
	}
	return r, k.g.observe(floor, r.Header, false)
}

// before refuses a request after a regression (and a write until the probe
// passed) and returns the floor its response is checked against.
func (k guardedKV) before(ctx context.Context, write bool) (int64, error) {
	if err := k.g.refused(); err != nil {
		return 0, err
	}
	if write {
		if err := k.g.verify(ctx, k.kv); err != nil {
			return 0, err
		}
	}
	return k.g.Floor(), nil
}

// GetStream is refused after a regression; its responses are not checked
// (the store streams only listing pages, at a revision it read through a
// checked Get or a cursor: provider/etcd/paging.go).
func (k guardedKV) GetStream(ctx context.Context, key string, opts ...clientv3.OpOption) (clientv3.GetStreamChan, error) {
	if err := k.g.refused(); err != nil {
		return nil, err
	}
	return k.kv.GetStream(ctx, key, opts...)
}

func (k guardedKV) Delete(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.DeleteResponse, error) {
	floor, err := k.before(ctx, true)
	if err != nil {
		return nil, err
	}
	r, err := k.kv.Delete(ctx, key, opts...)
	if err != nil {
		return nil, err
	}
	return r, k.g.observe(floor, r.Header, true)
}

func (k guardedKV) Compact(ctx context.Context, rev int64, opts ...clientv3.CompactOption) (*clientv3.CompactResponse, error) {
	if err := k.g.verify(ctx, k.kv); err != nil {
		return nil, err
	}
	floor := k.g.Floor()
	r, err := k.kv.Compact(ctx, rev, opts...)
	if err != nil {
		return nil, err
	}
	if err := k.g.observe(floor, r.Header, true); err != nil {
		return nil, err
	}
	return r, nil
}

func (k guardedKV) Do(ctx context.Context, op clientv3.Op) (clientv3.OpResponse, error) {
	if err := k.g.refused(); err != nil {
		return clientv3.OpResponse{}, err
	}
	if !op.IsGet() {
		if err := k.g.verify(ctx, k.kv); err != nil {
			return clientv3.OpResponse{}, err
		}
	}
	floor := k.g.Floor()
	r, err := k.kv.Do(ctx, op)
	if err != nil {
		return r, err
	}
	var h *pb.ResponseHeader
	switch {
	case r.Get() != nil:
		h = r.Get().Header
	case r.Put() != nil:
		h = r.Put().Header
	case r.Del() != nil:
		h = r.Del().Header
	case r.Txn() != nil:
		h = r.Txn().Header
	}
	if err := k.g.observe(floor, h, !op.IsGet()); err != nil {
		return clientv3.OpResponse{}, err
	}
	return r, nil
}

func (k guardedKV) Txn(ctx context.Context) clientv3.Txn {
	return &guardedTxn{txn: k.kv.Txn(ctx), g: k.g, ctx: ctx, kv: k.kv}
}

// guardedTxn is a Txn whose Commit passes the guard.
type guardedTxn struct {
	txn   clientv3.Txn
	g     *Guard
	ctx   context.Context //nolint:containedctx // the Txn's own, for the probe
	kv    clientv3.KV
	write bool
}

func (t *guardedTxn) If(cs ...clientv3.Cmp) clientv3.Txn { t.txn = t.txn.If(cs...); return t }

func (t *guardedTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.write = t.write || writes(ops)
	t.txn = t.txn.Then(ops...)
	return t
}

func (t *guardedTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.write = t.write || writes(ops)
	t.txn = t.txn.Else(ops...)
	return t
}

func (t *guardedTxn) Commit() (*clientv3.TxnResponse, error) {
	if err := t.g.refused(); err != nil {
		return nil, err
	}
	if t.write {
		if err := t.g.verify(t.ctx, t.kv); err != nil {
			return nil, err
		}
	}
	floor := t.g.Floor()
	r, err := t.txn.Commit()
	if err != nil {
		return nil, err
	}
	if err := t.g.observe(floor, r.Header, t.write); err != nil {
		return nil, err
	}
	return r, nil
}

// writes reports whether any of ops can change a key.
func writes(ops []clientv3.Op) bool {
	for _, op := range ops {
		if !op.IsGet() {
			return true
		}
	}
	return false
}
