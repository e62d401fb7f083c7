package etcd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/internal/etcdpage"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/metadata"

	"github.com/zlink-systems/authority/provider/etcd/internal/txnkit"
	"github.com/zlink-systems/authority/provider/etcd/schema"
)

// The copy of a resharding: reading a source namespace (a listing at one
// revision, then its changes), and writing their copies into the new
// cluster's namespace, each fenced on the key's ModRevision there and on the
// job's claim.

// Revision returns the cluster's current revision (a linearizable read).
func (m *Moves) Revision(ctx context.Context) (int64, error) {
	s := m.s
	if err := s.begin(ctx); err != nil {
		return 0, err
	}
	resp, err := s.read(unfenced(ctx))
	if err != nil {
		return 0, err
	}
	return resp.Header.Revision, nil
}

// List returns the keys under the namespace's segment prefix (relative to
// the namespace, e.g. "rows/") after the relative key after ("" from the
// first), at most limit, read at revision rev (0: the current revision),
// with the revision read at and whether more follow. A compacted revision
// is ErrFeedCompacted.
func (m *Moves) List(ctx context.Context, prefix, after string, rev int64, limit int) ([]*mvccpb.KeyValue, int64, bool, error) {
	return m.list(ctx, prefix, after, rev, limit, false)
}

// ListKeys is List without the values.
func (m *Moves) ListKeys(ctx context.Context, prefix, after string, rev int64, limit int) ([]*mvccpb.KeyValue, int64, bool, error) {
	return m.list(ctx, prefix, after, rev, limit, true)
}

func (m *Moves) list(ctx context.Context, prefix, after string, rev int64, limit int, keysOnly bool) ([]*mvccpb.KeyValue, int64, bool, error) {
	s := m.s
	if err := s.begin(ctx); err != nil {
		return nil, 0, false, err
	}
	ns := s.keys.Namespace()
	floor, from := ns+prefix, ns+prefix
	if after != "" {
		from = ns + after + "\x00"
	}
	var opts []clientv3.OpOption
	if keysOnly {
		opts = append(opts, clientv3.WithKeysOnly())
	}
	rctx, cancel := s.requestContext(ctx)
	defer cancel()
	// streamed (a page costs its own keys: a ranged Get with a limit walks
	// the rest of the range to count it, paging.go), else in windows
	p, ok, err := s.stream(rctx, from, prefixEnd(floor), rev, int64(limit), opts...)
	if !ok {
		p, err = etcdpage.ReadAfter(rctx, s.kv, from, floor, prefixEnd(floor), rev, int64(limit), opts...)
	}
	if err != nil {
		if errors.Is(err, rpctypes.ErrCompacted) {
			return nil, 0, false, authority.Wrap(authority.ErrFeedCompacted, fmt.Sprintf("etcd compacted revision %d of namespace %s", rev, ns), err)
		}
		return nil, 0, false, mapError(err, false)
	}
	at := p.Revision
	if at == 0 {
		at = rev
	}
	return p.Kvs, at, p.More, nil
}

// Rel returns key relative to the namespace ("" when outside it).
func (m *Moves) Rel(key string) string {
	rest, ok := strings.CutPrefix(key, m.s.keys.Namespace())
	if !ok {
		return ""
	}
	return rest
}

// KindOf classifies a key of the namespace for a resharding
// (schema.Layout.MoveKindOf).
func (m *Moves) KindOf(key string) (schema.MoveKind, authority.Key, string) {
	return m.s.keys.MoveKindOf(key)
}

// MoveWatch follows a namespace's changes for a resharding.
type MoveWatch struct {
	w      clientv3.Watcher
	ch     clientv3.WatchChan
	cancel context.CancelFunc
	ctx    context.Context
}

// MoveBatch is one response of a MoveWatch: its events (empty for a
// progress notification) and the revision it holds every change through.
type MoveBatch struct {
	Events  []*clientv3.Event
	Through int64
}

// Watch follows the namespace's changes after revision after, on a watch
// stream of its own (so RequestProgress concerns it alone). Close it.
func (m *Moves) Watch(ctx context.Context, after int64) *MoveWatch {
	s := m.s
	w := clientv3.NewWatcher(s.client)
	wctx := metadata.AppendToOutgoingContext(clientv3.WithRequireLeader(ctx), "authority-move", uuid.NewString())
	wctx, cancel := context.WithCancel(wctx)
	ns := s.keys.Namespace()
	ch := w.Watch(wctx, ns, clientv3.WithRange(prefixEnd(ns)), clientv3.WithRev(after+1), clientv3.WithProgressNotify())
	return &MoveWatch{w: w, ch: ch, cancel: cancel, ctx: wctx}
}

// Next returns the next batch. A compacted watch is ErrFeedCompacted; a
// watch that ended otherwise is ErrUnavailable.
func (w *MoveWatch) Next(ctx context.Context) (MoveBatch, error) {
	for {
		select {
		case <-ctx.Done():
			return MoveBatch{}, ctx.Err()
		case wr, ok := <-w.ch:
			switch {
			case !ok:
				return MoveBatch{}, authority.Wrap(authority.ErrUnavailable, "the resharding's watch ended", ctx.Err())
			case wr.CompactRevision != 0:
				return MoveBatch{}, authority.Wrap(authority.ErrFeedCompacted, fmt.Sprintf("etcd compacted revision %d", wr.CompactRevision), nil)
			case wr.Err() != nil:
				return MoveBatch{}, mapError(wr.Err(), false)
			case wr.IsProgressNotify():
				return MoveBatch{Through: wr.Header.Revision}, nil
			case len(wr.Events) > 0:
				return MoveBatch{Events: wr.Events, Through: wr.Events[len(wr.Events)-1].Kv.ModRevision}, nil
			}
		}
	}
}

// RequestProgress asks for a progress notification: a batch holding every
// change through the cluster's revision at the call.
func (w *MoveWatch) RequestProgress(ctx context.Context) error {
	return mapError(w.w.RequestProgress(w.ctx), false)
}

// Close ends the watch.
func (w *MoveWatch) Close() error {
	w.cancel()
	return w.w.Close()
}

// Raise writes the scratch raise key until the cluster's revision is at
// least to, parallel writes at a time (a new cluster's revision must be
// above its sources' before rows are copied into it: docs/operations.md).
// done is told the revision reached from time to time. It returns the
// revision reached.
func (m *Moves) Raise(ctx context.Context, to int64, parallel int, done func(int64)) (int64, error) {
	s := m.s
	if err := s.refuseWrite(); err != nil {
		return 0, err
	}
	cur, err := m.Revision(ctx)
	if err != nil || cur >= to {
		return cur, err
	}
	var reached atomic.Int64
	reached.Store(cur)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var once sync.Once
	var failed error
	key := s.keys.ReshardRaise()
	for range max(parallel, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for rctx.Err() == nil && reached.Load() < to {
				resp, err := s.kv.Put(rctx, key, "")
				if err != nil {
					once.Do(func() { failed = mapError(err, true); cancel() })
					return
				}
				if r := resp.Header.Revision; r > reached.Load() {
					reached.Store(r)
					if done != nil && r%1024 == 0 {
						done(r)
					}
				}
			}
		}()
	}
	wg.Wait()
	if r := reached.Load(); r >= to {
		return r, nil
	}
	if failed != nil {
		return reached.Load(), failed
	}
	return reached.Load(), ctx.Err()
}

// MoveWrite is one key a copy makes equal to a source's: Source is the
// source's key-value (nil: delete it here), Rel its key relative to the
// namespaces,
// Expect its ModRevision here (0: absent). Raw, when set, is written as the
// value instead of a copy of Source's (an owner generation).
type MoveWrite struct {
	Rel    string
	Source *mvccpb.KeyValue
	Expect int64
	Raw    *string
}

// ReadRevisions returns the ModRevision of each relative key here (absent:
// not in the map), read in one Txn.
func (m *Moves) ReadRevisions(ctx context.Context, rels []string) (map[string]int64, error) {
	s := m.s
	ops := make([]clientv3.Op, len(rels))
	for i, r := range rels {
		ops[i] = clientv3.OpGet(s.keys.Namespace()+r, clientv3.WithKeysOnly())
	}
	resp, err := s.read(unfenced(ctx), ops...)
	if err != nil {
		return nil, err
	}
	out := make(map[string]int64, len(rels))
	for k, kv := range txnkit.ReadsOf(resp) {
		out[m.Rel(k)] = kv.ModRevision
	}
	return out, nil
}

// Apply writes ws in one Txn, fenced on the claim and on each key's
// ModRevision being its Expect: a row is copied with its numbers
// (schema.Row.Moved) in this namespace's stored format, a capacity entry in
// this namespace's format with its node's capacity epoch put, a terminal on
// an expiry lease of the time it has left (an expired one is deleted here
// instead); srcNS is the namespace of the Sources' keys. ok false: a
// compare failed, nothing was written (the caller reads again). rev is the
// Txn's revision.
func (m *Moves) Apply(ctx context.Context, c *MoveClaim, srcNS string, ws []MoveWrite) (ok bool, rev int64, err error) {
	s := m.s
	if err := s.refuseWrite(); err != nil {
		return false, 0, err
	}
	src := schema.NewLayout(srcNS)
	ttls, err := m.leasesFor(ws)
	if err != nil {
		return false, 0, err
	}
	var resp *clientv3.TxnResponse
	err = s.leases.withLeases(ctx, ttls, func(ids []clientv3.LeaseID) error {
		t := &txnkit.Txn{}
		t.Cmp(c.cmp())
		next := 0
		for _, w := range ws {
			if err := m.addWrite(t, src, w, ids, &next); err != nil {
				return err
			}
		}
		if err := s.check(t, "copying a resharding's keys"); err != nil {
			return err
		}
		var err error
		resp, err = s.send(unfenced(ctx), t)
		return err
	})
	if err != nil {
		return false, 0, err
	}
	return resp.Succeeded, resp.Header.Revision, nil
}

// leasesFor returns the expiry each copied terminal of ws needs.
func (m *Moves) leasesFor(ws []MoveWrite) ([]time.Duration, error) {
	var ttls []time.Duration
	now := m.s.clock.Now()
	for _, w := range ws {
		if at, ok, err := terminalExpiry(w); err != nil {
			return nil, err
		} else if ok && at.After(now) {
			ttls = append(ttls, at.Sub(now))
		}
	}
	return ttls, nil
}

// terminalExpiry returns the expiry of a terminal copy (ok false: not a
// terminal put).
func terminalExpiry(w MoveWrite) (time.Time, bool, error) {
	if w.Source == nil || w.Raw != nil {
		return time.Time{}, false, nil
	}
	seg, _, _ := strings.Cut(w.Rel, "/")
	switch seg {
	case schema.SegReservations:
		r, err := schema.DecodeReservation(w.Source)
		return r.ExpiresAt, true, err
	case schema.SegTerminals:
		r, err := schema.DecodeTerminal(w.Source)
		if err != nil {
			return time.Time{}, true, err
		}
		return r.ExpiresAt, true, nil
	}
	return time.Time{}, false, nil
}

// addWrite adds w to t; next counts the leases of ids used.
func (m *Moves) addWrite(t *txnkit.Txn, src schema.Layout, w MoveWrite, ids []clientv3.LeaseID, next *int) error {
	s := m.s
	key := s.keys.Namespace() + w.Rel
	t.Cmp(modRevIs(key, w.Expect))
	kind, row, epoch := src.MoveKindOf(src.Namespace() + w.Rel)
	touch := func() {
		if epoch != "" {
			t.Touch(s.keys.Namespace() + epoch)
		}
	}
	switch {
	case w.Raw != nil:
		t.Put(key, *w.Raw)
		return nil
	case w.Source == nil:
		t.Del(key)
		touch()
		return nil
	}
	if at, ok, _ := terminalExpiry(w); ok {
		if !at.After(s.clock.Now()) {
			t.Del(key) // expired: not served, not copied
			return nil
		}
		t.Put(key, string(w.Source.Value), clientv3.WithLease(ids[*next]))
		*next++
		return nil
	}
	switch {
	case kind == schema.MoveWithRow && strings.HasPrefix(w.Rel, schema.SegRows+"/"):
		r, err := schema.DecodeRow(row, w.Source)
		if err != nil {
			return err
		}
		t.Put(key, s.rowValue(t, r.Moved()))
	case epoch != "":
		state, vec, err := schema.DecodeCapacityEntry(w.Source.Value)
		if err != nil {
			return err
		}
		t.Put(key, s.capacityValue(t, state, vec))
		touch()
	default:
		t.Put(key, string(w.Source.Value))
	}
	return nil
}

// DeleteMoved deletes the keys rels (relative), once the map in force here
// is at currentRev (a resharding deletes the keys it moved away from a
// source only after the next map is in force there), putting the capacity
// epoch of each capacity entry deleted. ok false: the map is not at
// currentRev, nothing was deleted.
func (m *Moves) DeleteMoved(ctx context.Context, currentRev int64, rels []string) (bool, error) {
	s := m.s
	if err := s.refuseWrite(); err != nil {
		return false, err
	}
	t := &txnkit.Txn{}
	t.Cmp(modRevIs(s.keys.ShardMap(), currentRev))
	for _, r := range rels {
		t.Del(s.keys.Namespace() + r)
		if _, _, epoch := s.keys.MoveKindOf(s.keys.Namespace() + r); epoch != "" {
			t.Touch(s.keys.Namespace() + epoch)
		}
	}
	if err := s.check(t, "deleting a resharding's moved keys"); err != nil {
		return false, err
	}
	resp, err := s.send(unfenced(ctx), t)
	if err != nil {
		return false, err
	}
	return resp.Succeeded, nil
}

// Count returns how many keys the namespace holds under the segment prefix
// (relative, e.g. "rows/").
func (m *Moves) Count(ctx context.Context, prefix string) (int64, error) {
	s := m.s
	if err := s.begin(ctx); err != nil {
		return 0, err
	}
	rctx, cancel := s.requestContext(ctx)
	defer cancel()
	resp, err := s.kv.Get(rctx, s.keys.Namespace()+prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, mapError(err, false)
	}
	return resp.Count, nil
}
