package etcd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	authority "github.com/zlink-systems/authority"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/zlink-systems/authority/provider/etcd/internal/txnkit"
	"github.com/zlink-systems/authority/provider/etcd/schema"
)

// What a resharding (package provider/sharded/reshard) does in one shard's
// namespace: its map steps (a move pending, the cluster frozen for it, the
// next map in force, or the move undone), the job's claim and record, and
// the copy of keys (movecopy.go). Every step is one Txn fenced on the keys
// it depends on; a step whose compare failed changes nothing and returns the
// keys as they are, so the caller can tell a step done before from one in
// the way. The key layout and values are schema's (schema/reshard.go).

// Moves is a store's resharding steps. Get it from Store.Moves.
type Moves struct{ s *Store }

// Moves returns the store's resharding steps.
func (s *Store) Moves() *Moves { return &Moves{s: s} }

// ErrMoveConflict reports a resharding step that found the shard map's keys
// other than it expected: another move is pending, another process runs the
// job, or the job's record changed under it. Nothing was written.
var ErrMoveConflict = errors.New("etcd: resharding step conflicts")

// MapKeys are the shard map's keys of a namespace (schema/reshard.go), each
// with its ModRevision (0: absent), read at Revision.
type MapKeys struct {
	Revision int64
	// Current is the map in force (nil: none stored).
	Current    *schema.ShardMap
	CurrentRev int64
	// Pending is the move in progress; Switching is set once this cluster
	// is frozen for it.
	Pending, Switching       *schema.ShardMove
	PendingRev, SwitchingRev int64
	// Job is the move's job record (in the new cluster).
	Job    *schema.ReshardJob
	JobRev int64
	// Mover names the process that holds the job's claim; MoverRev is the
	// claim key's CreateRevision.
	Mover    string
	MoverRev int64
}

// ReadMap reads the namespace's shard map keys, linearizably. A key that
// does not decode is ErrCorrupt naming it.
func (m *Moves) ReadMap(ctx context.Context) (MapKeys, error) {
	s := m.s
	if err := s.begin(ctx); err != nil {
		return MapKeys{}, err
	}
	resp, err := s.read(unfenced(ctx), clientv3.OpGet(s.keys.ShardMapPrefix(), clientv3.WithPrefix()))
	if err != nil {
		return MapKeys{}, err
	}
	return m.mapKeysIn(resp)
}

// mapKeysIn decodes the shard map keys a Txn read (a prefix get of them).
func (m *Moves) mapKeysIn(resp *clientv3.TxnResponse) (MapKeys, error) {
	l := m.s.keys
	k := MapKeys{Revision: resp.Header.Revision}
	for _, kv := range txnkit.ReadsOf(resp) {
		var err error
		switch string(kv.Key) {
		case l.ShardMap():
			var sm schema.ShardMap
			sm, err = schema.DecodeShardMap(kv)
			k.Current, k.CurrentRev = &sm, kv.ModRevision
		case l.ShardMovePending():
			var mv schema.ShardMove
			mv, err = schema.DecodeShardMove(kv)
			k.Pending, k.PendingRev = &mv, kv.ModRevision
		case l.ShardMoveSwitching():
			var mv schema.ShardMove
			mv, err = schema.DecodeShardMove(kv)
			k.Switching, k.SwitchingRev = &mv, kv.ModRevision
		case l.ReshardJob():
			var j schema.ReshardJob
			j, err = schema.DecodeReshardJob(kv)
			k.Job, k.JobRev = &j, kv.ModRevision
		case l.ReshardMover():
			k.Mover, k.MoverRev = string(kv.Value), kv.CreateRevision
		}
		if err != nil {
			return MapKeys{}, err
		}
	}
	return k, nil
}

// step sends one map step: cmps, then ops, else a read of the map keys.
// ok reports whether it applied; the keys are read back either way (at the
// step's revision when it applied).
func (m *Moves) step(ctx context.Context, cmps []clientv3.Cmp, ops []clientv3.Op) (ok bool, k MapKeys, err error) {
	s := m.s
	if err := s.refuseWrite(); err != nil {
		return false, MapKeys{}, err
	}
	if err := s.begin(ctx); err != nil {
		return false, MapKeys{}, err
	}
	read := clientv3.OpGet(s.keys.ShardMapPrefix(), clientv3.WithPrefix())
	rctx, cancel := s.requestContext(ctx)
	defer cancel()
	resp, err := s.kv.Txn(rctx).If(cmps...).Then(append(ops, read)...).Else(read).Commit()
	if err != nil {
		return false, MapKeys{}, mapError(err, true)
	}
	k, err = m.mapKeysIn(resp) // the puts' responses hold no keys
	return resp.Succeeded, k, err
}

// Begin puts mv as the namespace's pending move, if the map in force is
// still at k.CurrentRev and no move is pending. In the new cluster (target)
// it also needs the namespace to hold no map and no row. ok false: the keys
// say why (the same move pending already is not a conflict for the caller).
func (m *Moves) Begin(ctx context.Context, mv schema.ShardMove, k MapKeys, target bool) (bool, MapKeys, error) {
	if err := mv.Check(); err != nil {
		return false, MapKeys{}, authority.Wrap(authority.ErrInvalidArgument, "The shard move is not a valid move", err)
	}
	l := m.s.keys
	cmps := []clientv3.Cmp{modRevIs(l.ShardMap(), k.CurrentRev), modRevIs(l.ShardMovePending(), 0)}
	if target {
		cmps = append(cmps, modRevIs(l.ShardMap(), 0),
			clientv3.Compare(clientv3.CreateRevision(l.RowsPrefix()), "=", 0).WithPrefix())
	}
	return m.step(ctx, cmps, []clientv3.Op{clientv3.OpPut(l.ShardMovePending(), mv.Encode())})
}

// Freeze freezes a source cluster for the pending move: it puts the map in
// force again (its ModRevision moves, so every write routed before fails
// its map fence and routes again) and the switching key, which refuses the
// writes of the rows that move. It holds only while the map in force and
// the pending move are at k's revisions and nothing froze the cluster yet.
// The step's revision is the last at which a row that moves could change.
func (m *Moves) Freeze(ctx context.Context, k MapKeys) (bool, MapKeys, error) {
	if k.Pending == nil {
		return false, k, m.noMove()
	}
	l := m.s.keys
	return m.step(ctx,
		[]clientv3.Cmp{modRevIs(l.ShardMap(), k.CurrentRev), modRevIs(l.ShardMovePending(), k.PendingRev), modRevIs(l.ShardMoveSwitching(), 0)},
		[]clientv3.Op{clientv3.OpPut(l.ShardMap(), k.Pending.From.Encode()), clientv3.OpPut(l.ShardMoveSwitching(), k.Pending.Encode())})
}

// Switch puts the pending move's next map in force, and deletes the
// pending and switching keys, while the map in force and the pending move
// are at k's revisions.
func (m *Moves) Switch(ctx context.Context, k MapKeys) (bool, MapKeys, error) {
	if k.Pending == nil {
		return false, k, m.noMove()
	}
	l := m.s.keys
	return m.step(ctx,
		[]clientv3.Cmp{modRevIs(l.ShardMap(), k.CurrentRev), modRevIs(l.ShardMovePending(), k.PendingRev)},
		[]clientv3.Op{clientv3.OpPut(l.ShardMap(), k.Pending.To.Encode()), clientv3.OpDelete(l.ShardMovePending()), clientv3.OpDelete(l.ShardMoveSwitching())})
}

// Undo abandons the pending move (an abort before the switch): it deletes
// the pending and switching keys and, in a cluster that holds the map in
// force, puts it again (so that writers that saw the cluster frozen route
// again), while the keys are at k's revisions.
func (m *Moves) Undo(ctx context.Context, k MapKeys) (bool, MapKeys, error) {
	if k.Pending == nil {
		return false, k, m.noMove()
	}
	l := m.s.keys
	ops := []clientv3.Op{clientv3.OpDelete(l.ShardMovePending()), clientv3.OpDelete(l.ShardMoveSwitching())}
	if k.Current != nil || k.Switching != nil {
		ops = append(ops, clientv3.OpPut(l.ShardMap(), k.Pending.From.Encode()))
	}
	return m.step(ctx,
		[]clientv3.Cmp{modRevIs(l.ShardMap(), k.CurrentRev), modRevIs(l.ShardMovePending(), k.PendingRev), modRevIs(l.ShardMoveSwitching(), k.SwitchingRev)},
		ops)
}

func (m *Moves) noMove() error {
	return fmt.Errorf("%w: namespace %s has no pending shard move", ErrMoveConflict, m.s.keys.Namespace())
}

// MoveClaim is the claim of the one process running a move's job: the
// mover key, attached to a lease the claim keeps alive. Every write of the
// job into the new cluster compares the key's CreateRevision, so a process
// whose claim ended writes nothing more there.
type MoveClaim struct {
	m      *Moves
	lease  clientv3.LeaseID
	rev    int64
	done   chan struct{}
	stop   context.CancelFunc
	wg     sync.WaitGroup
	closed sync.Once
}

// Claim takes the job's claim for who with a lease of ttl, if no process
// holds it (ErrMoveConflict naming the holder otherwise: a claim whose
// process died ends with its lease, ttl after its last keep-alive).
func (m *Moves) Claim(ctx context.Context, who string, ttl time.Duration) (*MoveClaim, error) {
	s := m.s
	if err := s.refuseWrite(); err != nil {
		return nil, err
	}
	if err := authority.RequireText(who, "mover name"); err != nil {
		return nil, err
	}
	grant, err := s.client.Grant(ctx, int64(max(ttl, 2*time.Second)/time.Second))
	if err != nil {
		return nil, mapError(err, false)
	}
	key := s.keys.ReshardMover()
	rctx, cancel := s.requestContext(ctx)
	defer cancel()
	resp, err := s.kv.Txn(rctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, who, clientv3.WithLease(grant.ID))).Else(clientv3.OpGet(key)).Commit()
	if err != nil || !resp.Succeeded {
		_, _ = s.client.Revoke(context.WithoutCancel(ctx), grant.ID)
	}
	if err != nil {
		return nil, mapError(err, true)
	}
	if !resp.Succeeded {
		holder := "another process"
		if kv := txnkit.ReadsOf(resp)[key]; kv != nil {
			holder = fmt.Sprintf("%q (since revision %d)", kv.Value, kv.CreateRevision)
		}
		return nil, fmt.Errorf("%w: the job of namespace %s is run by %s", ErrMoveConflict, s.keys.Namespace(), holder)
	}
	c := &MoveClaim{m: m, lease: grant.ID, rev: resp.Header.Revision, done: make(chan struct{})}
	life, stop := context.WithCancel(s.life)
	c.stop = stop
	ch, err := s.client.KeepAlive(life, grant.ID)
	if err != nil {
		stop()
		_, _ = s.client.Revoke(context.WithoutCancel(ctx), grant.ID)
		return nil, mapError(err, false)
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		for range ch { // closes when the lease ends or the claim is released
		}
		close(c.done)
	}()
	return c, nil
}

// Done is closed once the claim ended (its lease lost, or released).
func (c *MoveClaim) Done() <-chan struct{} { return c.done }

// Revision is the claim key's CreateRevision.
func (c *MoveClaim) Revision() int64 { return c.rev }

// Release ends the claim and revokes its lease.
func (c *MoveClaim) Release(ctx context.Context) error {
	var err error
	c.closed.Do(func() {
		c.stop()
		c.wg.Wait()
		rctx, cancel := c.m.s.requestContext(ctx)
		defer cancel()
		if _, rerr := c.m.s.client.Revoke(rctx, c.lease); rerr != nil {
			err = mapError(rerr, false)
		}
	})
	return err
}

// cmp is the claim's fence.
func (c *MoveClaim) cmp() clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(c.m.s.keys.ReshardMover()), "=", c.rev)
}

// PutJob writes the job record j, while the claim holds and the record is
// at prev (0: absent). It returns the record's new revision, or
// ErrMoveConflict with the keys as they are (the record changed: paused or
// aborted by another process, or the claim ended).
func (m *Moves) PutJob(ctx context.Context, c *MoveClaim, j schema.ReshardJob, prev int64) (int64, MapKeys, error) {
	ok, k, err := m.step(ctx, []clientv3.Cmp{c.cmp(), modRevIs(m.s.keys.ReshardJob(), prev)},
		[]clientv3.Op{clientv3.OpPut(m.s.keys.ReshardJob(), j.Encode())})
	if err != nil {
		return 0, k, err
	}
	if !ok {
		return 0, k, fmt.Errorf("%w: the job record of namespace %s changed (revision %d, not %d) or the claim ended",
			ErrMoveConflict, m.s.keys.Namespace(), k.JobRev, prev)
	}
	return k.JobRev, k, nil
}

// EditJob changes the job record with edit, without the claim, while the
// record is as read (a pause or an abort asked by another process than the
// mover): it reads the record, applies edit and writes it back fenced on
// its revision, again when it changed meanwhile. A false from edit writes
// nothing. No record: ErrMoveConflict.
func (m *Moves) EditJob(ctx context.Context, edit func(*schema.ReshardJob) bool) (schema.ReshardJob, error) {
	for {
		k, err := m.ReadMap(ctx)
		if err != nil {
			return schema.ReshardJob{}, err
		}
		if k.Job == nil {
			return schema.ReshardJob{}, fmt.Errorf("%w: namespace %s holds no resharding job", ErrMoveConflict, m.s.keys.Namespace())
		}
		j := *k.Job
		if !edit(&j) {
			return j, nil
		}
		ok, _, err := m.step(ctx, []clientv3.Cmp{modRevIs(m.s.keys.ReshardJob(), k.JobRev)},
			[]clientv3.Op{clientv3.OpPut(m.s.keys.ReshardJob(), j.Encode())})
		if err != nil || ok {
			return j, err
		}
	}
}

// DeleteJob deletes the job record and the raise key (a finished or
// undone move, so that the namespace may be a move's target again), while
// the claim holds.
func (m *Moves) DeleteJob(ctx context.Context, c *MoveClaim) error {
	l := m.s.keys
	ok, _, err := m.step(ctx, []clientv3.Cmp{c.cmp()}, []clientv3.Op{clientv3.OpDelete(l.ReshardJob()), clientv3.OpDelete(l.ReshardRaise())})
	if err == nil && !ok {
		err = fmt.Errorf("%w: the claim of namespace %s ended", ErrMoveConflict, l.Namespace())
	}
	return err
}

// WatchMap reports each change of the namespace's shard map keys: the
// channel receives (at most one change waiting) until ctx ends, the watch
// fails or stop is called, then closes. stop returns once the watch's
// stream is closed.
func (m *Moves) WatchMap(ctx context.Context) (changed <-chan struct{}, stop func()) {
	s := m.s
	out := make(chan struct{}, 1)
	w := clientv3.NewWatcher(s.client)
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	wch := w.Watch(wctx, s.keys.ShardMapPrefix(), clientv3.WithPrefix())
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(out)
		for wr := range wch {
			if wr.Err() != nil || wr.Canceled {
				return
			}
			if len(wr.Events) > 0 {
				select {
				case out <- struct{}{}:
				default:
				}
			}
		}
	}()
	return out, func() {
		cancel()
		_ = w.Close()
		<-done
	}
}
