package reshard_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/sharded"
	"github.com/zlink-systems/authority/provider/sharded/reshard"
)

func jobConfig(cs []etcdstore.Config, n int) reshard.Config {
	return reshard.Config{Shards: cs[:n], Add: cs[n], LeaseWait: 5 * time.Second, AggregateWait: time.Second}
}

// keyCount is how many keys a namespace holds under a relative prefix.
func keyCount(t testing.TB, c etcdstore.Config, prefix string) int64 {
	t.Helper()
	resp, err := c.Client.Get(context.Background(), c.Namespace+prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	return resp.Count
}

// TestAbortBeforeTheSwitch: a job stopped while its sources are frozen is
// aborted: the map in force stays (one shard), the sources are unfrozen
// (every row writable again, the moving ones included), the new cluster
// holds none of the copies, every acknowledged write stays, and a new job
// into the same cluster then runs to its end.
func TestAbortBeforeTheSwitch(t *testing.T) {
	ctx := context.Background()
	cs := clusters(t)
	f := newFleet(t, cs, 1, 2)
	f.fill(40)
	f.start()
	jctx, cancel := context.WithCancel(ctx)
	cfg := jobConfig(cs, 1)
	cfg.Step = func(step string) {
		if step == "applying the last changes" {
			cancel() // stopped with its sources frozen
		}
	}
	_, err := reshard.Run(jctx, cfg)
	require.ErrorIs(t, err, context.Canceled)
	p, err := reshard.Status(ctx, jobConfig(cs, 1))
	require.NoError(t, err)
	require.Equal(t, schema.PhaseSwitching, p.Phase)
	p, err = reshard.Abort(ctx, jobConfig(cs, 1))
	require.NoError(t, err)
	require.Equal(t, schema.PhaseAborted, p.Phase)
	time.Sleep(300 * time.Millisecond) // writes after the abort, moving rows included
	f.halt()
	require.Equal(t, 1, f.stores[0].Shards())
	for _, prefix := range []string{"rows/", "owner-rows/", "capacity/", "reservations/", "terminals/", "owner-gens/", "capacity-epochs/"} {
		require.Zero(t, keyCount(t, cs[1], prefix), "the new cluster keeps %s keys", prefix)
	}
	for _, prefix := range []string{"shard-map/pending", "shard-map/switching"} {
		require.Zero(t, keyCount(t, cs[0], prefix))
	}
	f.verify(cs, 1)
	// abort again: nothing to do
	p, err = reshard.Abort(ctx, jobConfig(cs, 1))
	require.NoError(t, err)
	require.Equal(t, schema.PhaseAborted, p.Phase)
	// the cluster may be added afterwards
	grow(t, cs, 1, nil)
	f.verify(cs, 2)
}

// TestPauseAndResume: a paused job stops at its next step and is not run
// by Run (ErrPaused); Resume runs it to its end.
func TestPauseAndResume(t *testing.T) {
	ctx := context.Background()
	cs := clusters(t)
	f := newFleet(t, cs, 1, 1)
	f.fill(150)
	cfg := jobConfig(cs, 1)
	var once sync.Once
	cfg.Step = func(step string) {
		if strings.HasPrefix(step, "copying shard 0 after") {
			once.Do(func() {
				_, err := reshard.Pause(ctx, jobConfig(cs, 1))
				require.NoError(t, err)
			})
		}
	}
	p, err := reshard.Run(ctx, cfg)
	require.ErrorIs(t, err, reshard.ErrPaused)
	require.True(t, p.Paused)
	require.Equal(t, schema.PhaseCopying, p.Phase)
	_, err = reshard.Run(ctx, jobConfig(cs, 1))
	require.ErrorIs(t, err, reshard.ErrPaused)
	st, err := reshard.Status(ctx, jobConfig(cs, 1))
	require.NoError(t, err)
	require.True(t, st.Paused)
	p, err = reshard.Resume(ctx, jobConfig(cs, 1))
	require.NoError(t, err)
	require.Equal(t, schema.PhaseDone, p.Phase)
	require.False(t, p.Paused)
	f.verify(cs, 2)
}

// TestFrozenRowsAreRefused: while the sources are frozen, a write of a row
// that moves is refused with ErrMoving (an ErrUnavailable naming the row,
// both shards and the job) and writes nothing; a row that stays is
// written; reads of both are served. After the switch both are written.
func TestFrozenRowsAreRefused(t *testing.T) {
	ctx := context.Background()
	cs := clusters(t)
	s := openStore(t, cs, 1, 1, nil)
	fx := conformance.NewFixture(t, harness(s, nil))
	lease, err := s.Registry().Acquire(ctx, conformance.NodeA, 1, "frozen", 20*time.Second)
	require.NoError(t, err)
	defer func() { _ = lease.Close(ctx) }()
	target := conformance.Target(conformance.NodeA, 1, lease.Token())
	mv, stay := fx.Key(authority.ObjectUserSpot, movingID(t, "moves", 1)), authority.Key("")
	mvRow := fx.Active(authority.ObjectUserSpot, movingID(t, "moves", 1), target)
	var stayRow *authority.Snapshot
	for i := 0; stay == ""; i++ {
		id := "stays-" + strings.Repeat("x", i)
		if k := fx.Key(authority.ObjectUserSpot, id); sharded.Place(k, 2) == 0 {
			stay, stayRow = k, fx.Active(authority.ObjectUserSpot, id, target)
		}
	}
	cfg := jobConfig(cs, 1)
	cfg.LeaseWait = 100 * time.Millisecond // the fixture's owners are marked live in shard 0 only
	checked := false
	cfg.Step = func(step string) {
		if step != "applying the last changes" || checked {
			return
		}
		checked = true
		_, err := s.CompareExchangeAuthority(ctx, mv, mvRow.StoreVersion, authority.Put([]byte("frozen")))
		require.ErrorIs(t, err, sharded.ErrMoving)
		require.ErrorIs(t, err, authority.ErrUnavailable)
		require.ErrorContains(t, err, string(mv))
		require.ErrorContains(t, err, "from shard 0 to shard 1")
		res, err := s.CompareExchangeAuthority(ctx, stay, stayRow.StoreVersion, authority.Put([]byte("written while frozen")))
		require.NoError(t, err)
		require.Equal(t, authority.KindStored, res.Kind)
		stayRow = res.Snapshot
		require.Equal(t, mvRow.Payload, fx.MustRow(mv).Payload, "a read of a frozen row is served")
		_, err = s.Registry().Acquire(ctx, conformance.NodeA, 1, "late", 5*time.Second)
		require.ErrorIs(t, err, sharded.ErrMoving, "no owner lease while frozen: the switch copies owner generations")
	}
	grow(t, cs, 1, func(c *reshard.Config) { c.Step, c.LeaseWait = cfg.Step, cfg.LeaseWait })
	require.True(t, checked)
	res, err := s.CompareExchangeAuthority(ctx, mv, mvRow.StoreVersion, authority.Put([]byte("after")))
	require.NoError(t, err)
	require.Equal(t, authority.KindStored, res.Kind)
	require.Equal(t, "written while frozen", string(fx.MustRow(stay).Payload))
}

// TestOneMoverAtATime: two jobs of one move started together: one runs it
// to its end, the other finds the job run by another process (ErrOtherMove
// after waiting for its claim) or finds it done; the move is made once.
func TestOneMoverAtATime(t *testing.T) {
	cs := clusters(t)
	f := newFleet(t, cs, 1, 1)
	f.fill(60)
	errs := make([]error, 2)
	progress := make([]reshard.Progress, 2)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cfg := jobConfig(cs, 1)
			cfg.ClaimTTL, cfg.Mover = 2*time.Second, "mover-"+string(rune('a'+i))
			progress[i], errs[i] = reshard.Run(context.Background(), cfg)
		}()
	}
	wg.Wait()
	done := 0
	for i := range 2 {
		if errs[i] == nil {
			require.Equal(t, schema.PhaseDone, progress[i].Phase)
			done++
			continue
		}
		require.True(t, errors.Is(errs[i], reshard.ErrOtherMove) || errors.Is(errs[i], etcdstore.ErrMoveConflict), "%v", errs[i])
	}
	require.Positive(t, done)
	if done == 2 {
		require.Equal(t, progress[0].Job, progress[1].Job, "one job")
	}
	f.verify(cs, 2)
}

// TestRefusedMoves: a move into a namespace that holds rows, or whose
// clusters are not the map in force in its order, is refused with the
// cause named, and writes nothing.
func TestRefusedMoves(t *testing.T) {
	ctx := context.Background()
	cs := clusters(t)
	s := openStore(t, cs, 1, 1, nil)
	fx := conformance.NewFixture(t, harness(s, nil))
	fx.Active(authority.ObjectUserSpot, "present", conformance.TargetA)
	// the new cluster already holds a store's rows
	busy := openStore(t, cs[1:], 1, 1, nil)
	bfx := conformance.NewFixture(t, harness(busy, nil))
	bfx.Active(authority.ObjectUserSpot, "elsewhere", conformance.TargetA)
	before := keyCount(t, cs[1], "")
	_, err := reshard.Run(ctx, jobConfig(cs, 1))
	require.ErrorIs(t, err, reshard.ErrOtherMove)
	require.ErrorContains(t, err, "holds a shard map, a pending move or rows (1)")
	require.Zero(t, keyCount(t, cs[0], "shard-map/"))
	require.Equal(t, before, keyCount(t, cs[1], ""), "nothing written in the cluster to add")
	// grow 1→2, then ask for 2→3 with the shards in the wrong order
	cs2 := clusters(t)
	openStore(t, cs2, 1, 1, nil)
	grow(t, cs2, 1, nil)
	_, err = reshard.Run(ctx, reshard.Config{Shards: []etcdstore.Config{cs2[1], cs2[0]}, Add: cs2[2]})
	require.ErrorIs(t, err, sharded.ErrShardMapMismatch)
	require.Zero(t, keyCount(t, cs2[2], ""), "nothing written in the cluster to add")
	_, err = reshard.Run(ctx, reshard.Config{Shards: cs2[:2]})
	require.ErrorIs(t, err, authority.ErrInvalidArgument)
	_, err = reshard.Status(ctx, jobConfig(cs2, 2))
	require.ErrorIs(t, err, reshard.ErrOtherMove, "no job in the cluster")
}

// TestNoStaleReadAcrossTheSwitch: between the new cluster's switch and its
// sources', a store that still holds the frozen map reads a moving row;
// another store wrote it in the new cluster meanwhile: the read sees that
// write (a read served by a frozen source is checked against the new
// cluster's switch), and so does a listing.
func TestNoStaleReadAcrossTheSwitch(t *testing.T) {
	ctx := context.Background()
	cs := clusters(t)
	writer, reader := openStore(t, cs, 1, 1, nil), openStore(t, cs, 1, 1, nil)
	lease, err := writer.Registry().Acquire(ctx, conformance.NodeA, 1, "switch", 20*time.Second)
	require.NoError(t, err)
	defer func() { _ = lease.Close(ctx) }()
	fx := conformance.NewFixture(t, harness(writer, nil))
	id := movingID(t, "switched", 1)
	key := fx.Key(authority.ObjectUserSpot, id)
	row := fx.Active(authority.ObjectUserSpot, id, conformance.Target(conformance.NodeA, 1, lease.Token()))
	checked := false
	grow(t, cs, 1, func(c *reshard.Config) {
		c.LeaseWait = 100 * time.Millisecond
		c.Step = func(step string) {
			switch step {
			case "applying the last changes": // the reader learns the frozen map
				_, err := reader.CompareExchangeAuthority(ctx, key, row.StoreVersion, authority.Put([]byte("refused")))
				require.ErrorIs(t, err, sharded.ErrMoving)
			case "switching shard 0": // the new cluster switched, the source not yet
				var res authority.CompareExchangeResult
				require.Eventually(t, func() bool {
					res, err = writer.CompareExchangeAuthority(ctx, key, row.StoreVersion, authority.Put([]byte("in the new cluster")))
					return err == nil
				}, time.Minute, 10*time.Millisecond)
				require.Equal(t, authority.KindStored, res.Kind)
				read, err := reader.ReadAuthority(ctx, key)
				require.NoError(t, err)
				require.Equal(t, "in the new cluster", string(read.Snapshot.Payload), "a stale read of the frozen source")
				page, err := reader.ListAuthorities(ctx, string(key), "", 10)
				require.NoError(t, err)
				require.Len(t, page.Items, 1)
				require.Equal(t, "in the new cluster", string(page.Items[0].Snapshot.Payload))
				checked = true
			}
		}
	})
	require.True(t, checked)
}

// TestPreparedAggregatesAtTheSwitch: an aggregate prepared before a move
// with a participant that moves and left undecided is aborted by the
// switch (its commit answers stale, its abort alreadyAborted, its rows
// unchanged); one whose
// participants all stay commits after the move.
func TestPreparedAggregatesAtTheSwitch(t *testing.T) {
	ctx := context.Background()
	cs := clusters(t)
	s := openStore(t, cs, 1, 1, nil)
	lease, err := s.Registry().Acquire(ctx, conformance.NodeA, 1, "agg", 20*time.Second)
	require.NoError(t, err)
	defer func() { _ = lease.Close(ctx) }()
	fx := conformance.NewFixture(t, harness(s, nil))
	from := conformance.Target(conformance.NodeA, 1, lease.Token())
	mv := movingID(t, "agg-moves", 1)
	movingRow := fx.Active(authority.ObjectUserSpot, mv, from)
	var stay string
	for i := 0; stay == ""; i++ {
		id := "agg-stays-" + strings.Repeat("y", i)
		if sharded.Place(fx.Key(authority.ObjectUserSpot, id), 2) == 0 {
			stay = id
		}
	}
	stayRow := fx.Active(authority.ObjectUserSpot, stay, from)
	moving := fx.MustPrepare(conformance.AggregateRequest("moving", 1, conformance.TargetB, conformance.Capacity(authority.ObjectUserSpot, conformance.DefaultStableType),
		conformance.Participant(fx.Key(authority.ObjectUserSpot, mv), movingRow.StoreVersion, authority.TransitionNewOwner, []byte("moved by aggregate"))))
	staying := fx.MustPrepare(conformance.AggregateRequest("staying", 1, conformance.TargetB, conformance.Capacity(authority.ObjectUserSpot, conformance.DefaultStableType),
		conformance.Participant(fx.Key(authority.ObjectUserSpot, stay), stayRow.StoreVersion, authority.TransitionNewOwner, []byte("kept in shard 0"))))
	p := grow(t, cs, 1, func(c *reshard.Config) {
		c.AggregateWait = 100 * time.Millisecond
		c.LeaseWait = 100 * time.Millisecond
	})
	require.Equal(t, schema.PhaseDone, p.Phase)
	res, err := s.CommitAggregate(ctx, moving)
	require.NoError(t, err)
	require.Equal(t, authority.KindStale, res.Kind, "the switch aborted the aggregate of a moving row")
	ab, err := s.AbortAggregate(ctx, moving)
	require.NoError(t, err)
	require.Equal(t, authority.KindAlreadyAborted, ab.Kind)
	require.Equal(t, movingRow.Payload, fx.MustRow(fx.Key(authority.ObjectUserSpot, mv)).Payload)
	res, err = s.CommitAggregate(ctx, staying)
	require.NoError(t, err)
	require.Equal(t, authority.KindCommitted, res.Kind)
	require.Equal(t, "kept in shard 0", string(fx.MustRow(fx.Key(authority.ObjectUserSpot, stay)).Payload))
}

// admitAll is a capacity policy admitting every placement.
type admitAll struct{}

func (admitAll) PlacementCapacityAvailable(authority.NodeDescriptor, authority.CapacityVector, authority.CapacityVector, authority.CapacityVector) bool {
	return true
}

// TestOneShardStoreWithPolicyFollowsOnlyWithSpares: a store of one shard
// with a capacity policy and Spares runs capacity escrow and routes by the
// map grown to two shards; one without Spares (no escrow, and no way to
// reach the new cluster) does not: its operations fail with
// ErrUnavailable naming the cluster, writing nothing.
func TestOneShardStoreWithPolicyFollowsOnlyWithSpares(t *testing.T) {
	ctx := context.Background()
	cs := clusters(t)
	s, err := sharded.New(ctx, sharded.Config{Shards: cs[:1], Spares: cs[1:2], CapacityPolicy: admitAll{}})
	require.NoError(t, err)
	defer func() { _ = s.Close() }()
	plain, err := sharded.New(ctx, sharded.Config{Shards: cs[:1], CapacityPolicy: admitAll{}})
	require.NoError(t, err)
	defer func() { _ = plain.Close() }()
	grow(t, cs, 1, func(c *reshard.Config) { c.LeaseWait = 100 * time.Millisecond })
	require.Eventually(t, func() bool {
		_, err := s.ReadAuthority(ctx, "user_spot/after")
		return err == nil && s.Shards() == 2
	}, time.Minute, 10*time.Millisecond)
	_, err = plain.ReadAuthority(ctx, "user_spot/after")
	require.ErrorIs(t, err, authority.ErrUnavailable)
	require.Equal(t, 1, plain.Shards())
}
