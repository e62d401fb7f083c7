package twophase_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/sharded/twophase"
)

// scenario is one aggregate over User Spot rows in every shard (Spots:
// their creation takes no operation ID, so fixtures of one namespace do not
// collide), its record in the last: row r0 moves from TargetA to TargetB (newOwner), the others stay
// (preserve). setup is the instance that made the rows; it plays the other
// store instance that finishes what a killed coordinator left.
type scenario struct {
	c      *cluster
	setup  *instance
	fx     *conformance.Fixture
	keys   []authority.Key
	before map[authority.Key]*authority.Snapshot
	req    authority.AggregatePrepareRequest
	// the actor usage of NodeA and NodeB before the rows were made
	usageA, usageB authority.CapacityUsage
	// settling is each shard's revision when settle began (0: not
	// settled)
	settling [shardCount]int64
}

func newScenario(t testing.TB, rows int) *scenario {
	t.Helper()
	h, c, in := newHarness(t, newRoundRobin(shardCount), false)
	return newScenarioIn(t, c, in, conformance.NewFixture(t, h), "agg", rows)
}

// newScenarioIn makes a scenario on c's namespaces (rows "<id>-r<i>",
// aggregate id) with setup instance in and its fixture fx.
func newScenarioIn(t testing.TB, c *cluster, in *instance, fx *conformance.Fixture, id string, rows int) *scenario {
	t.Helper()
	sc := &scenario{c: c, setup: in, fx: fx, before: map[authority.Key]*authority.Snapshot{}}
	sc.usageA = fx.Usage(conformance.NodeA, conformance.NodeLifecycle, authority.CounterSpots, "")
	sc.usageB = fx.Usage(conformance.NodeB, conformance.NodeLifecycle, authority.CounterSpots, "")
	var parts []authority.AggregateParticipant
	for i := range rows {
		id := fmt.Sprintf("%s-r%d", id, i)
		snap := sc.fx.Active(authority.ObjectUserSpot, id, conformance.TargetA)
		key := sc.fx.Key(authority.ObjectUserSpot, id)
		sc.keys = append(sc.keys, key)
		sc.before[key] = snap
		transition := authority.TransitionPreserve
		if i == 0 {
			transition = authority.TransitionNewOwner
		}
		parts = append(parts, conformance.Participant(key, snap.StoreVersion, transition, sc.payload(key)))
	}
	sc.req = conformance.AggregateRequest(id, 1, conformance.TargetB, conformance.Capacity(authority.ObjectUserSpot, conformance.DefaultStableType), parts...)
	return sc
}

// payload is the payload the aggregate gives the row at key.
func (sc *scenario) payload(key authority.Key) []byte { return []byte("aggregate:" + string(key)) }

func (sc *scenario) store() testStore { return testStore{sc.setup} }

// killed returns a new instance whose coordinator k kills.
func (sc *scenario) killed(t testing.TB, k *killer) *instance { return sc.c.instance(t, k.wrap) }

// raw reads the row at key from its shard's store without resolving locks.
func (sc *scenario) raw(t testing.TB, key authority.Key) *authority.Snapshot {
	t.Helper()
	res, err := sc.setup.storeOf(key).ReadAuthority(context.Background(), key)
	require.NoError(t, err)
	require.Equal(t, authority.KindSnapshot, res.Kind, "row %s", key)
	return res.Snapshot
}

// applied counts the participants whose rows (read raw) hold the
// aggregate's payload.
func (sc *scenario) applied(t testing.TB) int {
	n := 0
	for _, k := range sc.keys {
		if string(sc.raw(t, k).Payload) == string(sc.payload(k)) {
			n++
		}
	}
	return n
}

// record reads the aggregate's record in its coordinator shard (nil: none).
func (sc *scenario) record(t testing.TB) *etcdstore.CrossRecord {
	t.Helper()
	i := sc.c.router.CoordinatorOf(sc.req.AggregateID)
	rec, err := sc.setup.shards[i].ReadRecord(context.Background(), sc.req.Fence())
	require.NoError(t, err)
	return rec
}

// locks counts the row locks in every shard.
func (sc *scenario) locks(t testing.TB) int {
	t.Helper()
	n := 0
	for i, ns := range sc.c.namespaces {
		resp, err := shared[i].Get(context.Background(), schema.NewLayout(ns).RowLocksPrefix(), clientv3.WithPrefix(), clientv3.WithCountOnly())
		require.NoError(t, err)
		n += int(resp.Count)
	}
	return n
}

// settle ends the aggregate with the setup instance: a prepared one is
// aborted, a decided one finished; it returns whether it is committed.
func (sc *scenario) settle(t testing.TB) bool {
	t.Helper()
	ctx := context.Background()
	for i, ns := range sc.c.namespaces {
		resp, err := shared[i].Get(ctx, ns, clientv3.WithPrefix(), clientv3.WithCountOnly())
		require.NoError(t, err)
		sc.settling[i] = resp.Header.Revision
	}
	rec := sc.record(t)
	if rec != nil && rec.State == schema.AggregatePrepared {
		res, err := sc.setup.coord.AbortAggregate(ctx, sc.req.Fence())
		require.NoError(t, err)
		require.Equal(t, authority.KindAborted, res.Kind)
		return false
	}
	res, err := sc.setup.coord.CommitAggregate(ctx, sc.req.Fence())
	require.NoError(t, err)
	return res.Kind == authority.KindAlreadyCommitted
}

// check requires the settled aggregate all or nothing: committed, every
// row holds its payload and r0 moved with its capacity; else none does and
// no capacity moved; no lock is left and no capacity is reserved. It
// returns whether the aggregate was partial (applied in some rows only).
func (sc *scenario) check(t testing.TB, committed bool) (partial bool) {
	t.Helper()
	n := sc.applied(t)
	want := 0
	if committed {
		want = len(sc.keys)
	}
	partial = n != want
	if partial {
		t.Errorf("aggregate committed=%v applied in %d of %d rows", committed, n, len(sc.keys))
	}
	sc.resolveLateLocks(t)
	require.Zero(t, sc.locks(t), "row locks left")
	moved := int64(0)
	if committed {
		moved = 1
	}
	sc.fx.RequireUsage(conformance.NodeB, authority.CounterSpots, "", sc.usageB.Active+moved, 0)
	sc.fx.RequireUsage(conformance.NodeA, authority.CounterSpots, "", sc.usageA.Active+int64(len(sc.keys))-moved, 0)
	return partial
}

// resolveLateLocks resolves, as a writer meeting it would, a lock of a
// decided aggregate that landed after settle began: a lock Txn a killed
// coordinator sent on a context the kill then cancelled can still be
// applied by etcd after the settle released its aggregate's locks (seen at
// load 12 and more; in this trial or, landing later still, in a later
// one: a lock of an earlier trial's aggregate is late whenever it is
// found). The protocol leaves such a lock to whoever meets it. A lock of
// this aggregate there before the settle began, or of an aggregate still
// prepared, is one the protocol failed to release, and fails the test.
func (sc *scenario) resolveLateLocks(t testing.TB) {
	t.Helper()
	ctx := context.Background()
	for i, ns := range sc.c.namespaces {
		prefix := schema.NewLayout(ns).RowLocksPrefix()
		resp, err := shared[i].Get(ctx, prefix, clientv3.WithPrefix())
		require.NoError(t, err)
		for _, kv := range resp.Kvs {
			l, err := schema.DecodeRowLock(kv)
			require.NoError(t, err)
			key := authority.Key(strings.TrimPrefix(string(kv.Key), prefix))
			if l.Fence == sc.req.Fence() { // else an earlier trial's, settled
				require.True(t, sc.settling[i] > 0 && kv.CreateRevision > sc.settling[i],
					"a lock of aggregate %s on %s left from before the settle", l.Fence.AggregateID, key)
			}
			rec, err := sc.setup.shards[sc.c.router.CoordinatorOf(l.Fence.AggregateID)].ReadRecord(ctx, l.Fence)
			require.NoError(t, err)
			require.False(t, rec != nil && rec.Incarnation == l.Incarnation && rec.State == schema.AggregatePrepared,
				"a lock of aggregate %s left while it is prepared", l.Fence.AggregateID)
			require.NoError(t, sc.setup.coord.Resolve(ctx, etcdstore.RowLock{Key: key, Lock: l, Revision: kv.ModRevision}))
			t.Logf("resolved a lock of aggregate %s on %s that landed after the settle began", l.Fence.AggregateID, key)
		}
	}
}

// prepare prepares the scenario's aggregate through in.
func (sc *scenario) prepare(t testing.TB, in *instance) (authority.PrepareAggregateResult, error) {
	return in.coord.PrepareAggregate(context.Background(), sc.req)
}

var _ twophase.Router = (*roundRobin)(nil)
