package etcd_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// epochLifecycles returns the lifecycles of NodeA whose capacity epoch
// exists in ns.
func epochLifecycles(t *testing.T, ns string) []int64 {
	t.Helper()
	return nodeEpochs(t, ns, conformance.NodeA)
}

// nodeEpochs returns the lifecycles of node whose capacity epoch exists in
// ns.
func nodeEpochs(t *testing.T, ns string, node authority.NodeDescriptor) []int64 {
	t.Helper()
	resp, err := shared.Get(context.Background(), ns+"capacity-epochs/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	require.NoError(t, err)
	var out []int64
	for _, kv := range resp.Kvs {
		e, err := schema.DecodeEntry(ns, kv)
		require.NoError(t, err)
		require.Equal(t, schema.EntryCapacityEpoch, e.Kind)
		if e.Node == node {
			out = append(out, e.Lifecycle)
		}
	}
	return out
}

// lifecycleOwner is the owner fixtures place on NodeA at lifecycle l.
func lifecycleOwner(l int64) authority.OwnerToken {
	return authority.OwnerToken{OwnerID: fmt.Sprintf("owner-l%d", l), LeaseGeneration: 1}
}

// Epochs of node lifecycles without capacity entries go, in Txns cut to
// --max-txn-ops (8 here); those with entries stay, and a pruned lifecycle takes
// reservations again (its epoch comes back).
func TestPruneCapacityEpochs(t *testing.T) {
	ns := etcdtest.Namespace()
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, nil, etcdstore.Config{Namespace: ns, Clock: clock, MaxTxnOps: 8})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	ctx := context.Background()

	n, err := s.PruneCapacityEpochs(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "nothing to prune in an empty namespace")

	const lifecycles = 20
	var kept []int64
	for l := int64(1); l <= lifecycles; l++ {
		target := conformance.Target(conformance.NodeA, l, lifecycleOwner(l))
		fx.SetLive(target, true)
		r := fx.Reserve(authority.ObjectActor, fmt.Sprintf("obj-%d", l), target)
		if l%3 == 0 {
			fx.MustComplete(r, authority.TerminalCreated, []byte("ready"), fx.Publication())
			kept = append(kept, l)
		} else if l%3 == 1 {
			kept = append(kept, l) // stays reserved
		}
	}
	require.Len(t, epochLifecycles(t, ns), lifecycles)
	for l := int64(1); l <= lifecycles; l++ {
		if l%3 == 2 {
			removed, err := s.RemoveAllByOwner(ctx, lifecycleOwner(l))
			require.NoError(t, err)
			require.EqualValues(t, 1, removed)
		}
	}
	require.Len(t, epochLifecycles(t, ns), lifecycles, "removing entries puts the epoch, it does not delete it")

	before := s.WriteStats().Txns
	n, err = s.PruneCapacityEpochs(ctx)
	require.NoError(t, err)
	require.Equal(t, lifecycles-len(kept), n)
	require.ElementsMatch(t, kept, epochLifecycles(t, ns))
	// pages of 7 epochs (8 ops less the outer Txn's one), each with an empty one
	require.EqualValues(t, 3, s.WriteStats().Txns-before, "one write Txn a page")
	for _, l := range kept {
		u := fx.Usage(conformance.NodeA, l, authority.ObjectActor, conformance.DefaultStableType)
		if l%3 == 0 {
			require.Equal(t, authority.CapacityUsage{Active: 1}, u)
		} else {
			require.Equal(t, authority.CapacityUsage{Reserved: 1}, u)
		}
	}

	before = s.WriteStats().Txns
	n, err = s.PruneCapacityEpochs(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "a second prune finds nothing")
	require.Equal(t, before, s.WriteStats().Txns, "and writes nothing")

	// a pruned lifecycle reserves again under a policy, and counts from zero
	s.SetCapacityPolicy(conformance.ActorLimit(1))
	target := conformance.Target(conformance.NodeA, 2, lifecycleOwner(2))
	fx.Reserve(authority.ObjectActor, "again", target)
	res, err := s.Reserve(ctx, fx.ReserveRequest(authority.ObjectActor, "over", target))
	require.NoError(t, err)
	require.Equal(t, authority.KindPlacementCapacityExhausted, res.Kind)
	require.Contains(t, epochLifecycles(t, ns), int64(2))
}

// A reservation decided on usage read before its node's entries were
// removed and its epoch pruned does not commit on that stale decision: its
// fence fails and it asks the policy again, with the usage after the prune.
// (A "no newer than the read" fence would pass on the deleted epoch.) The
// same holds for a node whose entries have no epoch (a build before epochs
// wrote them): the decision puts one first, or a decision on the absent
// epoch would survive the entries' removal and a prune.
func TestPruneFailsAStaleDecision(t *testing.T) {
	for _, withoutEpoch := range []bool{false, true} {
		t.Run(fmt.Sprintf("entriesWithoutEpoch=%v", withoutEpoch), func(t *testing.T) {
			ns := etcdtest.Namespace()
			clock := authority.NewManualClock(testEpoch)
			s := newStore(t, nil, etcdstore.Config{Namespace: ns, Clock: clock})
			fx := conformance.NewFixture(t, harnessFor(s, clock))
			ctx := context.Background()
			other := conformance.Target(conformance.NodeA, conformance.NodeLifecycle, lifecycleOwner(9))
			fx.SetLive(other, true)
			fx.Reserve(authority.ObjectActor, "held", other)
			require.Equal(t, []int64{conformance.NodeLifecycle}, epochLifecycles(t, ns))
			if withoutEpoch {
				_, err := shared.Delete(ctx, ns+"capacity-epochs/", clientv3.WithPrefix())
				require.NoError(t, err)
			}

			p := stallFirstDecision(s)
			var res authority.ReserveResult
			var rerr error
			done := make(chan struct{})
			go func() {
				defer close(done)
				res, rerr = s.Reserve(ctx, fx.ReserveRequest(authority.ObjectActor, "late", conformance.TargetA))
			}()
			<-p.entered
			require.Equal(t, []int64{conformance.NodeLifecycle}, epochLifecycles(t, ns), "the decision has an epoch")
			removed, err := s.RemoveAllByOwner(ctx, other.Owner)
			require.NoError(t, err)
			require.EqualValues(t, 1, removed)
			n, err := s.PruneCapacityEpochs(ctx)
			require.NoError(t, err)
			require.Equal(t, 1, n)
			require.Empty(t, epochLifecycles(t, ns))
			close(p.release)
			<-done

			require.NoError(t, rerr)
			require.Equal(t, authority.KindReserved, res.Kind)
			require.Equal(t, []int64{1, 0}, p.seenUsage(), "decided again on the usage after the prune")
			fx.RequireUsage(conformance.NodeA, authority.ObjectActor, conformance.DefaultStableType, 0, 1)
			// the node's usage watch follows on
			u, ok, err := etcdstore.WatchedUsage(ctx, s, conformance.NodeA, conformance.NodeLifecycle, authority.ObjectActor, conformance.DefaultStableType)
			require.NoError(t, err)
			require.True(t, ok, "the watch caught up with the reservation after the prune")
			require.Equal(t, authority.CapacityUsage{Reserved: 1}, u)
		})
	}
}

// The same holds for an aggregate prepare under a policy: its decision on
// the target node's usage is fenced on the epoch it read.
func TestPruneFailsAStaleAggregateDecision(t *testing.T) {
	ns := etcdtest.Namespace()
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, nil, etcdstore.Config{Namespace: ns, Clock: clock})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	ctx := context.Background()
	a1 := fx.Active(authority.ObjectActor, "a1", conformance.TargetA)
	other := conformance.Target(conformance.NodeB, conformance.NodeLifecycle, lifecycleOwner(9))
	fx.SetLive(other, true)
	fx.Reserve(authority.ObjectActor, "held", other)
	req := conformance.AggregateRequest("agg-prune", 1, conformance.TargetB, authority.CapacityVector{Actors: 1},
		conformance.Participant(fx.Key(authority.ObjectActor, "a1"), a1.StoreVersion, authority.TransitionNewOwner, []byte("a1-moved")))

	p := stallFirstDecision(s)
	var res authority.PrepareAggregateResult
	var perr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		res, perr = s.PrepareAggregate(ctx, req)
	}()
	<-p.entered
	removed, err := s.RemoveAllByOwner(ctx, other.Owner)
	require.NoError(t, err)
	require.EqualValues(t, 1, removed)
	n, err := s.PruneCapacityEpochs(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n, "NodeB's epoch goes; NodeA holds a1")
	require.Empty(t, nodeEpochs(t, ns, conformance.NodeB))
	require.Equal(t, []int64{conformance.NodeLifecycle}, nodeEpochs(t, ns, conformance.NodeA))
	close(p.release)
	<-done

	require.NoError(t, perr)
	require.Equal(t, authority.KindPrepared, res.Kind)
	require.Equal(t, []int64{1, 0}, p.seenUsage(), "decided again on the usage after the prune")
	fx.RequireUsage(conformance.NodeB, authority.ObjectActor, conformance.DefaultStableType, 0, 1)
}

// stalledPolicy admits every request, records the actors (reserved plus
// active) each decision saw, and holds the first decision until release is
// closed; entered is closed once it holds.
type stalledPolicy struct {
	mu               sync.Mutex
	seen             []int64
	calls            atomic.Int64
	entered, release chan struct{}
}

// stallFirstDecision sets a stalledPolicy as the capacity policy of s.
func stallFirstDecision(s *etcdstore.Store) *stalledPolicy {
	p := &stalledPolicy{entered: make(chan struct{}), release: make(chan struct{})}
	s.SetCapacityPolicy(conformance.CapacityPolicyFunc(func(_ authority.NodeDescriptor, _, reserved, active authority.CapacityVector) bool {
		p.mu.Lock()
		p.seen = append(p.seen, reserved.Actors+active.Actors)
		p.mu.Unlock()
		if p.calls.Add(1) == 1 {
			close(p.entered)
			<-p.release
		}
		return true
	}))
	return p
}

// seenUsage returns the actors each decision saw, in order.
func (p *stalledPolicy) seenUsage() []int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]int64(nil), p.seen...)
}

// With as many epochs as the server's --max-txn-ops (the default 128 here,
// the store's default too), the nested deletes are cut to what etcd allows;
// a key under capacity-epochs/ that names no node lifecycle is left and
// reported, after the others are pruned.
func TestPruneAtTheServersTxnLimit(t *testing.T) {
	ns := etcdtest.Namespace()
	s := newStore(t, nil, etcdstore.Config{Namespace: ns})
	ctx := context.Background()
	const epochs = 2*etcdstore.DefaultMaxTxnOps + 3
	var puts []clientv3.Op
	for l := 1; l <= epochs; l++ {
		puts = append(puts, clientv3.OpPut(fmt.Sprintf("%scapacity-epochs/mesh-1/node-a/%d", ns, l), ""))
		if len(puts) == 100 || l == epochs {
			_, err := shared.Txn(ctx).Then(puts...).Commit()
			require.NoError(t, err)
			puts = nil
		}
	}
	junk := ns + "capacity-epochs/not-a-node"
	_, err := shared.Put(ctx, junk, "")
	require.NoError(t, err)

	before := s.WriteStats().Txns
	n, err := s.PruneCapacityEpochs(ctx)
	require.ErrorIs(t, err, authority.ErrCorrupt)
	require.ErrorContains(t, err, "not-a-node")
	require.Equal(t, epochs, n)
	require.EqualValues(t, 3, s.WriteStats().Txns-before, "259 epochs, 127 a Txn")
	left, err := shared.Get(ctx, ns+"capacity-epochs/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	require.NoError(t, err)
	require.Len(t, left.Kvs, 1)
	require.Equal(t, junk, string(left.Kvs[0].Key))
}

// epochPutTimesOut fails (server-side timeout, an unknown outcome) every
// Txn whose only Then op is a put of a capacity epoch, the backfill's,
// while *on is set.
func epochPutTimesOut(on *atomic.Bool) func(then []clientv3.Op) error {
	return func(then []clientv3.Op) error {
		if on.Load() && len(then) == 1 && then[0].IsPut() && strings.Contains(string(then[0].KeyBytes()), "/capacity-epochs/") {
			return rpctypes.ErrTimeout
		}
		return nil
	}
}

// When the put of a missing epoch that a decision needs fails with an
// unknown outcome, the reservation and the prepare that needed it were not
// sent: they fail with ErrUnavailable, not ErrOutcomeUnknown, and write
// nothing.
func TestEpochBackfillFailureIsNotTheCallersOutcome(t *testing.T) {
	var on atomic.Bool
	c := server.Client(t)
	c.KV = failingKV{KV: c.KV, fail: epochPutTimesOut(&on)}
	ns := etcdtest.Namespace()
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, c, etcdstore.Config{Namespace: ns, Clock: clock})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	ctx := context.Background()
	fx.Reserve(authority.ObjectActor, "held", conformance.TargetA)
	_, err := shared.Delete(ctx, ns+"capacity-epochs/", clientv3.WithPrefix())
	require.NoError(t, err)
	s.SetCapacityPolicy(conformance.ActorLimit(10))
	before, err := shared.Get(ctx, ns, clientv3.WithPrefix())
	require.NoError(t, err)
	on.Store(true)

	_, err = s.Reserve(ctx, fx.ReserveRequest(authority.ObjectActor, "late", conformance.TargetA))
	require.ErrorIs(t, err, authority.ErrUnavailable)
	require.NotErrorIs(t, err, authority.ErrOutcomeUnknown)
	after, err := shared.Get(ctx, ns, clientv3.WithPrefix())
	require.NoError(t, err)
	require.Equal(t, before.Kvs, after.Kvs, "nothing was written")

	on.Store(false)
	res, err := s.Reserve(ctx, fx.ReserveRequest(authority.ObjectActor, "late", conformance.TargetA))
	require.NoError(t, err)
	require.Equal(t, authority.KindReserved, res.Kind, "a retry puts the epoch and reserves")
	require.Equal(t, []int64{conformance.NodeLifecycle}, epochLifecycles(t, ns))
}
