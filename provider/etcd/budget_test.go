package etcd_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/sharded/escrow"
)

// escrowKeys counts the keys under the namespace's capacity-escrow/ segment.
func escrowKeys(t *testing.T, ns string) int64 {
	t.Helper()
	resp, err := shared.Get(context.Background(), schema.Prefix(ns, schema.EntryEscrow), clientv3.WithPrefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	return resp.Count
}

// TestEscrowOffWritesNoBudgetKeys: a store without Config.CapacityEscrow,
// under a capacity policy, reserves, prepares and commits an aggregate and
// aborts exactly as before, and writes no budget key.
func TestEscrowOffWritesNoBudgetKeys(t *testing.T) {
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, nil, etcdstore.Config{Clock: clock, CapacityPolicy: conformance.ActorLimit(2)})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	fx.Reserve(authority.ObjectActor, "a1", conformance.TargetA)
	fx.Reserve(authority.ObjectActor, "a2", conformance.TargetA)
	res, err := s.Reserve(fx.Ctx(), fx.ReserveRequest(authority.ObjectActor, "a3", conformance.TargetA))
	require.NoError(t, err)
	require.Equal(t, authority.KindPlacementCapacityExhausted, res.Kind)
	spot := fx.Active(authority.ObjectUserSpot, "s1", conformance.TargetA)
	fence := fx.MustPrepare(conformance.AggregateRequest("move", 1, conformance.TargetB, conformance.Capacity(authority.ObjectUserSpot, conformance.DefaultStableType),
		conformance.Participant(fx.Key(authority.ObjectUserSpot, "s1"), spot.StoreVersion, authority.TransitionNewOwner, []byte("moved"))))
	c, err := s.CommitAggregate(fx.Ctx(), fence)
	require.NoError(t, err)
	require.Equal(t, authority.KindCommitted, c.Kind)
	require.Zero(t, escrowKeys(t, s.Namespace()), "a store without escrow writes no budget key")
}

// escrowStore is a store in escrow mode on a one-shard mover (its ledger
// and its slice in its own namespace).
func escrowStore(t *testing.T, cfg etcdstore.Config) (*etcdstore.Store, *escrow.Mover) {
	t.Helper()
	m, err := escrow.New(escrow.Config{Shards: 1})
	require.NoError(t, err)
	cfg.CapacityEscrow = m.Hook(0)
	s := newStore(t, nil, cfg)
	require.NoError(t, m.Attach(0, s.Budget()))
	return s, m
}

// TestBudgetStepsRefuseBadInput: every step refuses input it cannot act on
// with ErrInvalidArgument naming it, and writes nothing.
func TestBudgetStepsRefuseBadInput(t *testing.T) {
	s, _ := escrowStore(t, etcdstore.Config{CapacityPolicy: conformance.ActorLimit(10)})
	ctx := context.Background()
	b := s.Budget()
	node, lc := conformance.NodeA, conformance.NodeLifecycle
	actors := schema.BudgetCounter{Kind: authority.ObjectActor}
	for name, step := range map[string]func() error{
		"empty mesh": func() error {
			_, err := b.Slice(ctx, authority.NodeDescriptor{RID: "r"}, lc)
			return err
		},
		"NUL in the RID": func() error {
			_, err := b.Release(ctx, authority.NodeDescriptor{MeshName: "m", RID: "r\x00"}, lc)
			return err
		},
		"negative lifecycle": func() error {
			_, err := b.Ledger(ctx, node, -1)
			return err
		},
		"negative receipt": func() error {
			_, err := b.Receive(ctx, node, lc, schema.Budget{actors: -1})
			return err
		},
		"shard out of range": func() error {
			_, err := b.Grant(ctx, node, lc, 1<<16, authority.CapacityVector{Actors: 1})
			return err
		},
		"negative shard": func() error {
			_, err := b.Credit(ctx, node, lc, -1, schema.Budget{})
			return err
		},
		"zero ask": func() error {
			_, err := b.Grant(ctx, node, lc, 0, authority.CapacityVector{})
			return err
		},
		"credit above what was given": func() error {
			_, err := b.Credit(ctx, node, lc, 0, schema.Budget{actors: 1})
			return err
		},
	} {
		err := step()
		require.ErrorIs(t, err, authority.ErrInvalidArgument, name)
	}
	require.Zero(t, escrowKeys(t, s.Namespace()), "nothing written")
}

// TestBudgetStepsAreIdempotent: a receipt or a credit applied twice, or an
// older figure after a newer one, changes nothing (and writes nothing); a
// release with no slack writes nothing; a grant the policy refuses is
// ErrBudgetExhausted and changes nothing.
func TestBudgetStepsAreIdempotent(t *testing.T) {
	clock := authority.NewManualClock(testEpoch)
	s, _ := escrowStore(t, etcdstore.Config{Clock: clock, CapacityPolicy: conformance.ActorLimit(10)})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	ctx := context.Background()
	b := s.Budget()
	node, lc := conformance.NodeA, conformance.NodeLifecycle
	actors := schema.BudgetCounter{Kind: authority.ObjectActor}
	modRev := func(key string) int64 {
		resp, err := shared.Get(ctx, key)
		require.NoError(t, err)
		if len(resp.Kvs) == 0 {
			return 0
		}
		return resp.Kvs[0].ModRevision
	}
	layout := schema.NewLayout(s.Namespace())
	sliceKey, ledgerKey := layout.BudgetSlice(node, lc), layout.BudgetLedger(node, lc)

	led, err := b.Grant(ctx, node, lc, 0, authority.CapacityVector{Actors: 11}, authority.CapacityVector{Actors: 6})
	require.NoError(t, err)
	require.Equal(t, schema.Budget{actors: 6}, led.Shards[0].Given, "the first ask the policy admits")
	_, err = b.Grant(ctx, node, lc, 0, authority.CapacityVector{Actors: 5})
	require.ErrorIs(t, err, etcdstore.ErrBudgetExhausted, "6 granted and 5 more pass the limit of 10")
	require.Equal(t, led, mustLedger(t, b))

	sl, err := b.Receive(ctx, node, lc, schema.Budget{actors: 6})
	require.NoError(t, err)
	require.Equal(t, schema.Budget{actors: 6}, sl.Size())
	rev := modRev(sliceKey)
	for _, given := range []schema.Budget{{actors: 6}, {actors: 4}, {}} {
		again, err := b.Receive(ctx, node, lc, given)
		require.NoError(t, err)
		require.Equal(t, sl, again)
	}
	require.Equal(t, rev, modRev(sliceKey), "a figure received before writes nothing")

	fx.Reserve(authority.ObjectActor, "a1", conformance.TargetA)
	sl, err = b.Release(ctx, node, lc)
	require.NoError(t, err)
	require.Equal(t, schema.Budget{actors: 5}, sl.Returned, "the slack beyond the one reserved actor")
	rev = modRev(sliceKey)
	again, err := b.Release(ctx, node, lc)
	require.NoError(t, err)
	require.Equal(t, sl, again)
	require.Equal(t, rev, modRev(sliceKey), "a release without slack writes nothing")

	led, err = b.Credit(ctx, node, lc, 0, sl.Returned)
	require.NoError(t, err)
	require.Equal(t, schema.Budget{actors: 1}, led.Granted())
	rev = modRev(ledgerKey)
	for _, returned := range []schema.Budget{{actors: 5}, {actors: 2}} {
		again, err := b.Credit(ctx, node, lc, 0, returned)
		require.NoError(t, err)
		require.Equal(t, led, again)
	}
	require.Equal(t, rev, modRev(ledgerKey), "a figure credited before writes nothing")
	nodes, err := b.Ledgers(ctx)
	require.NoError(t, err)
	require.Equal(t, []etcdstore.NodeLifecycle{{Node: node, Lifecycle: lc}}, nodes)
}

func mustLedger(t *testing.T, b etcdstore.BudgetSteps) schema.BudgetLedger {
	t.Helper()
	l, err := b.Ledger(context.Background(), conformance.NodeA, conformance.NodeLifecycle)
	require.NoError(t, err)
	return l
}

// TestEscrowModeOnOneShard: in escrow mode on a one-shard mover the limit
// is the policy's exactly: the first reservation grows the slice (with the
// part of the chunk the policy admits), the ones after it fit the slice
// without the ledger until the last, the one past the limit is exhausted;
// a read-only store refuses the write steps and reads a slice.
func TestEscrowModeOnOneShard(t *testing.T) {
	clock := authority.NewManualClock(testEpoch)
	s, m := escrowStore(t, etcdstore.Config{Clock: clock, CapacityPolicy: conformance.ActorLimit(5)})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	for i := range 5 {
		fx.Reserve(authority.ObjectActor, fmt.Sprintf("a%d", i), conformance.TargetA)
	}
	res, err := s.Reserve(fx.Ctx(), fx.ReserveRequest(authority.ObjectActor, "a5", conformance.TargetA))
	require.NoError(t, err)
	require.Equal(t, authority.KindPlacementCapacityExhausted, res.Kind)
	st := m.Stats()
	require.Equal(t, int64(2), st.Grants, "two grants served every reservation: 4 (the chunk the policy admits), then 1")
	require.Equal(t, int64(2), st.Grows)
	require.Zero(t, st.Exhausted, "the sixth is refused by the policy on the shard's own usage, before any grow")

	ro := newStore(t, nil, etcdstore.Config{Namespace: s.Namespace(), ReadOnly: true, SkipVersionCheck: true})
	_, err = ro.Budget().Release(context.Background(), conformance.NodeA, conformance.NodeLifecycle)
	require.ErrorIs(t, err, authority.ErrAccessDenied)
	_, err = ro.Budget().Grant(context.Background(), conformance.NodeA, conformance.NodeLifecycle, 0, authority.CapacityVector{Actors: 1})
	require.True(t, errors.Is(err, etcdstore.ErrReadOnly), "%v", err)
	sl, err := ro.Budget().Slice(context.Background(), conformance.NodeA, conformance.NodeLifecycle)
	require.NoError(t, err, "a read-only store reads a slice")
	require.Equal(t, schema.Budget{schema.BudgetCounter{Kind: authority.ObjectActor}: 5}, sl.Slice.Size())
}

// escrowFunc is a CapacityEscrow of a test: another implementation of the
// hook than the mover's, to see what the store makes of its answers.
type escrowFunc func(ctx context.Context, req etcdstore.BudgetRequest) error

func (f escrowFunc) Grow(ctx context.Context, req etcdstore.BudgetRequest) error { return f(ctx, req) }

// TestEscrowHookAnswers: whatever a CapacityEscrow answers, a reservation
// short of its slice ends with a contract outcome and writes nothing it
// was not admitted for: a refusal is placementCapacityExhausted, an escrow that never grows the slice ends
// in ErrUnavailable after a bounded number of grows, an error of its own
// (unclassified, or of unknown outcome) is ErrUnavailable and not
// ErrOutcomeUnknown (the reservation was not sent).
func TestEscrowHookAnswers(t *testing.T) {
	var calls int
	var answer error
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, nil, etcdstore.Config{Clock: clock, CapacityPolicy: conformance.ActorLimit(10),
		CapacityEscrow: escrowFunc(func(_ context.Context, req etcdstore.BudgetRequest) error {
			calls++
			if req.Node != conformance.NodeA || !req.Need.Equal(authority.CapacityVector{Actors: 1}) {
				return fmt.Errorf("unexpected request %+v", req)
			}
			return answer
		})})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	for _, tc := range []struct {
		name   string
		answer error
		kind   authority.ResultKind
		is     error
	}{
		{"refused", fmt.Errorf("no: %w", etcdstore.ErrBudgetExhausted), authority.KindPlacementCapacityExhausted, nil},
		{"never grows", nil, "", authority.ErrUnavailable},
		{"unclassified error", errors.New("mover broke"), "", authority.ErrUnavailable},
		{"unknown outcome", authority.Wrap(authority.ErrOutcomeUnknown, "lost", nil), "", authority.ErrUnavailable},
	} {
		calls, answer = 0, tc.answer
		res, err := s.Reserve(fx.Ctx(), fx.ReserveRequest(authority.ObjectActor, "a-"+tc.name, conformance.TargetA))
		if tc.is != nil {
			require.ErrorIs(t, err, tc.is, tc.name)
			require.NotErrorIs(t, err, authority.ErrOutcomeUnknown, tc.name)
		} else {
			require.NoError(t, err, tc.name)
			require.Equal(t, tc.kind, res.Kind, tc.name)
		}
		require.Positive(t, calls, tc.name)
		require.LessOrEqual(t, calls, 16, tc.name)
		fx.RequireUsage(conformance.NodeA, authority.ObjectActor, "", 0, 0)
	}
}
