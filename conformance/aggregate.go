package conformance

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
)

// move is a prepared-to-be aggregate: an active Actor a1 on TargetA moving
// to TargetB, next to an active Actor b1 of TargetB kept in place.
type move struct {
	a1, b1       *authority.Snapshot
	a1Key, b1Key authority.Key
	req          authority.AggregatePrepareRequest
}

func newMove(fx *Fixture) move {
	m := move{
		a1:    fx.Active(authority.ObjectActor, "a1", TargetA),
		b1:    fx.Active(authority.ObjectActor, "b1", TargetB),
		a1Key: fx.Key(authority.ObjectActor, "a1"),
		b1Key: fx.Key(authority.ObjectActor, "b1"),
	}
	m.req = AggregateRequest("agg-1", 1, TargetB, authority.CapacityVector{Actors: 1},
		Participant(m.a1Key, m.a1.StoreVersion, authority.TransitionNewOwner, []byte("a1-moved")),
		Participant(m.b1Key, m.b1.StoreVersion, authority.TransitionPreserve, []byte("b1-kept")),
	)
	return m
}

func prepareKind(t *testing.T, fx *Fixture, req authority.AggregatePrepareRequest) authority.ResultKind {
	t.Helper()
	res, err := fx.Store().PrepareAggregate(fx.Ctx(), req)
	require.NoError(t, err)
	return res.Kind
}

func commitAggregateKind(t *testing.T, fx *Fixture, fence authority.Fence) authority.ResultKind {
	t.Helper()
	res, err := fx.Store().CommitAggregate(fx.Ctx(), fence)
	require.NoError(t, err)
	return res.Kind
}

func abortAggregateKind(t *testing.T, fx *Fixture, fence authority.Fence) authority.ResultKind {
	t.Helper()
	res, err := fx.Store().AbortAggregate(fx.Ctx(), fence)
	require.NoError(t, err)
	return res.Kind
}

// RunTestAggregatePrepare checks PrepareAggregate: prepared, alreadyPrepared,
// and its conflict and stale cases, in the contract's order of checks.
func RunTestAggregatePrepare(ctx context.Context, t *testing.T, f Factory) {
	// conflict requires KindConflict (or want) and no change at all.
	rejected := func(t *testing.T, fx *Fixture, req authority.AggregatePrepareRequest, want authority.ResultKind) {
		t.Helper()
		before := fx.State()
		require.Equal(t, want, prepareKind(t, fx, req))
		fx.RequireState(before)
	}
	runSubtests(ctx, t, f, []subtest{
		{"Prepared", func(t *testing.T, fx *Fixture) {
			m := newMove(fx)
			before := fx.State()
			fx.MustPrepare(m.req)
			after := fx.State()
			require.Equal(t, before.Rows, after.Rows, "prepare writes no row")
			fx.RequireUsage(NodeB, authority.ObjectActor, "", 1, 1)
			fx.RequireUsage(NodeA, authority.ObjectActor, "", 1, 0)
		}},
		{"PreparedWithDeadSourceOwner", func(t *testing.T, fx *Fixture) {
			m := newMove(fx)
			fx.SetLive(TargetA, false)
			fx.MustPrepare(m.req)
		}},
		{"PreparedSpots", func(t *testing.T, fx *Fixture) {
			s1 := fx.Active(authority.ObjectUserSpot, "s1", TargetA)
			s2 := fx.Active(authority.ObjectUserSpot, "s2", TargetA)
			capacity := authority.CapacityVector{Spots: 2, SpotType: &authority.SpotTypeCapacity{ObjectKind: authority.ObjectUserSpot, StableType: DefaultStableType, Count: 2}}
			req := AggregateRequest("agg-s", 1, TargetB, capacity,
				Participant(fx.Key(authority.ObjectUserSpot, "s1"), s1.StoreVersion, authority.TransitionNewOwner, nil),
				Participant(fx.Key(authority.ObjectUserSpot, "s2"), s2.StoreVersion, authority.TransitionNewOwner, nil))
			fx.MustPrepare(req)
			fx.RequireUsage(NodeB, authority.ObjectUserSpot, DefaultStableType, 0, 2)
			fx.RequireUsage(NodeB, authority.CounterSpots, "", 0, 2)
		}},
		{"AlreadyPrepared", func(t *testing.T, fx *Fixture) {
			m := newMove(fx)
			fence := fx.MustPrepare(m.req)
			before := fx.State()
			res, err := fx.Store().PrepareAggregate(fx.Ctx(), *m.req.Clone())
			require.NoError(t, err)
			require.Equal(t, authority.KindAlreadyPrepared, res.Kind)
			require.Equal(t, fence, res.Fence)
			fx.RequireState(before)
		}},
		{"ConflictOtherRequestSameFence", func(t *testing.T, fx *Fixture) {
			m := newMove(fx)
			fx.MustPrepare(m.req)
			other := m.req.Clone()
			other.Participants[0].AuthorityPayload = []byte("different")
			rejected(t, fx, *other, authority.KindConflict)
		}},
		{"ConflictAnyFieldDiffers", func(t *testing.T, fx *Fixture) {
			// A prepared record answers
			// alreadyPrepared only to the very same request; any field that
			// differs is conflict, and the record stays as it was.
			m := newMove(fx)
			fence := fx.MustPrepare(m.req)
			c := Target(NodeB, NodeLifecycle, authority.OwnerToken{OwnerID: "owner-c", LeaseGeneration: 1})
			fx.SetLive(c, true)
			for _, tc := range []struct {
				name string
				mod  func(r *authority.AggregatePrepareRequest)
			}{
				{"TargetOwner", func(r *authority.AggregatePrepareRequest) { r.TargetOwner = c.Owner }},
				{"TargetLease", func(r *authority.AggregatePrepareRequest) { r.TargetOwner.LeaseGeneration++ }},
				{"InventoryDigest", func(r *authority.AggregatePrepareRequest) { r.InventoryDigest[0] ^= 0xff }},
				{"TargetDescriptor", func(r *authority.AggregatePrepareRequest) { r.TargetDescriptor.RID = "node-c" }},
				{"TargetMesh", func(r *authority.AggregatePrepareRequest) { r.TargetDescriptor.MeshName = "mesh-2" }},
				{"TargetLifecycle", func(r *authority.AggregatePrepareRequest) { r.TargetDescriptorLifecycleGeneration++ }},
				{"Capacity", func(r *authority.AggregatePrepareRequest) { r.Capacity = authority.CapacityVector{Actors: 2} }},
				{"ParticipantCount", func(r *authority.AggregatePrepareRequest) { r.Participants = r.Participants[:1] }},
				{"ParticipantVersion", func(r *authority.AggregatePrepareRequest) {
					r.Participants[0].ExpectedStoreVersion = m.b1.StoreVersion
				}},
				{"ParticipantTransition", func(r *authority.AggregatePrepareRequest) {
					r.Participants[1].OwnerTransition = authority.TransitionNewOwner
				}},
				{"ParticipantMembership", func(r *authority.AggregatePrepareRequest) {
					r.Participants[1].MembershipMutation = []byte("other membership")
				}},
			} {
				other := m.req.Clone()
				tc.mod(other)
				before := fx.State()
				require.Equal(t, authority.KindConflict, prepareKind(t, fx, *other), tc.name)
				fx.RequireState(before)
			}
			require.Equal(t, authority.KindAlreadyPrepared, prepareKind(t, fx, m.req))
			fx.RequireUsage(NodeB, authority.ObjectActor, "", 1, 1)
			require.Equal(t, authority.KindCommitted, commitAggregateKind(t, fx, fence))
			a1 := fx.MustRow(m.a1Key)
			require.Equal(t, []byte("a1-moved"), a1.Payload)
			require.Equal(t, OwnerB, a1.Owner())
			require.Equal(t, NodeB, a1.Allocation.Descriptor)
		}},
		{"StaleAfterCommit", func(t *testing.T, fx *Fixture) {
			m := newMove(fx)
			fence := fx.MustPrepare(m.req)
			require.Equal(t, authority.KindCommitted, commitAggregateKind(t, fx, fence))
			rejected(t, fx, m.req, authority.KindStale)
		}},
		{"StaleAfterCommitOtherRequest", func(t *testing.T, fx *Fixture) {
			// A committed record answers stale to any request of its
			// fence, not conflict.
			m := newMove(fx)
			fence := fx.MustPrepare(m.req)
			require.Equal(t, authority.KindCommitted, commitAggregateKind(t, fx, fence))
			other := m.req.Clone()
			other.Participants[0].AuthorityPayload = []byte("different")
			rejected(t, fx, *other, authority.KindStale)
		}},
		{"ConflictAfterAbort", func(t *testing.T, fx *Fixture) {
			m := newMove(fx)
			fence := fx.MustPrepare(m.req)
			require.Equal(t, authority.KindAborted, abortAggregateKind(t, fx, fence))
			rejected(t, fx, m.req, authority.KindConflict)
		}},
		{"NextGenerationIsNewAggregate", func(t *testing.T, fx *Fixture) {
			m := newMove(fx)
			fence := fx.MustPrepare(m.req)
			require.Equal(t, authority.KindAborted, abortAggregateKind(t, fx, fence))
			next := m.req.Clone()
			next.AggregateGeneration++
			fx.MustPrepare(*next)
		}},
		{"ConflictTargetNotLive", func(t *testing.T, fx *Fixture) {
			m := newMove(fx)
			fx.SetLive(TargetB, false)
			rejected(t, fx, m.req, authority.KindConflict)
		}},
		{"ConflictTargetCapacity", func(t *testing.T, fx *Fixture) {
			needCapacityPolicy(t, fx)
			m := newMove(fx)
			fx.H.SetCapacityPolicy(t, ActorLimit(1))
			rejected(t, fx, m.req, authority.KindConflict)
		}},
		{"ConflictParticipantVersion", func(t *testing.T, fx *Fixture) {
			m := newMove(fx)
			fx.Put(m.a1Key, m.a1.StoreVersion, []byte("changed"))
			rejected(t, fx, m.req, authority.KindConflict)
		}},
		{"ConflictParticipantMissing", func(t *testing.T, fx *Fixture) {
			m := newMove(fx)
			req := m.req.Clone()
			req.Participants = append(req.Participants, Participant(fx.Key(authority.ObjectActor, "zz"), m.a1.StoreVersion, authority.TransitionPreserve, nil))
			rejected(t, fx, *req, authority.KindConflict)
		}},
		{"ConflictParticipantReserved", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectActor, "a1", TargetA)
			req := AggregateRequest("agg-r", 1, TargetB, authority.CapacityVector{Actors: 1},
				Participant(r.Key, r.Res.Creating.StoreVersion, authority.TransitionNewOwner, nil))
			rejected(t, fx, req, authority.KindConflict)
		}},
		{"ConflictPreservedOwnerNotLive", func(t *testing.T, fx *Fixture) {
			m := newMove(fx)
			c := Target(NodeA, NodeLifecycle, authority.OwnerToken{OwnerID: "owner-c", LeaseGeneration: 1})
			fx.SetLive(c, true)
			c1 := fx.Active(authority.ObjectActor, "c1", c)
			req := m.req.Clone()
			req.Participants = append(req.Participants, Participant(fx.Key(authority.ObjectActor, "c1"), c1.StoreVersion, authority.TransitionPreserve, nil))
			fx.SetLive(c, false)
			rejected(t, fx, *req, authority.KindConflict)
		}},
		{"ConflictCapacityMismatch", func(t *testing.T, fx *Fixture) {
			m := newMove(fx)
			req := m.req.Clone()
			req.Capacity = authority.CapacityVector{Actors: 2}
			rejected(t, fx, *req, authority.KindConflict)
		}},
		{"ConflictSpotTypeMismatch", func(t *testing.T, fx *Fixture) {
			// Capacity equality compares the Spot type's kind and stable
			// type too: equal counts of another Spot type are conflict.
			s1 := fx.Active(authority.ObjectUserSpot, "s1", TargetA)
			for _, st := range []authority.SpotTypeCapacity{
				{ObjectKind: authority.ObjectUserSpot, StableType: "type-b", Count: 1},
				{ObjectKind: authority.ObjectInstanceSpot, StableType: DefaultStableType, Count: 1},
			} {
				req := AggregateRequest("agg-st", 1, TargetB, authority.CapacityVector{Spots: 1, SpotType: &st},
					Participant(fx.Key(authority.ObjectUserSpot, "s1"), s1.StoreVersion, authority.TransitionNewOwner, nil))
				rejected(t, fx, req, authority.KindConflict)
			}
			noType := AggregateRequest("agg-st", 1, TargetB, authority.CapacityVector{Spots: 1},
				Participant(fx.Key(authority.ObjectUserSpot, "s1"), s1.StoreVersion, authority.TransitionNewOwner, nil))
			rejected(t, fx, noType, authority.KindConflict)
			fx.MustPrepare(AggregateRequest("agg-st", 1, TargetB, Capacity(authority.ObjectUserSpot, DefaultStableType),
				Participant(fx.Key(authority.ObjectUserSpot, "s1"), s1.StoreVersion, authority.TransitionNewOwner, nil)))
		}},
		{"ConflictPreserveOnly", func(t *testing.T, fx *Fixture) {
			m := newMove(fx)
			req := AggregateRequest("agg-p", 1, TargetB, authority.CapacityVector{Actors: 1},
				Participant(m.b1Key, m.b1.StoreVersion, authority.TransitionPreserve, nil))
			rejected(t, fx, req, authority.KindConflict)
		}},
	})
}

// policyCall is one call of a recording capacity policy.
type policyCall struct {
	node                        authority.NodeDescriptor
	requested, reserved, active authority.CapacityVector
}

// policyCalls records the calls of a capacity policy answering fits.
type policyCalls struct {
	mu    sync.Mutex
	fits  bool
	calls []policyCall
}

// recordPolicy installs a policy that records its calls and answers fits.
func recordPolicy(t *testing.T, fx *Fixture, fits bool) *policyCalls {
	t.Helper()
	needCapacityPolicy(t, fx)
	p := &policyCalls{fits: fits}
	fx.H.SetCapacityPolicy(t, CapacityPolicyFunc(func(node authority.NodeDescriptor, requested, reserved, active authority.CapacityVector) bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.calls = append(p.calls, policyCall{node, requested.Clone(), reserved.Clone(), active.Clone()})
		return p.fits
	}))
	return p
}

// last returns the last call, requiring one.
func (p *policyCalls) last(t *testing.T) policyCall {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	require.NotEmpty(t, p.calls, "the capacity policy was not consulted")
	return p.calls[len(p.calls)-1]
}

// requireVector requires got to equal want (Equal compares Spot types too).
func requireVector(t *testing.T, want, got authority.CapacityVector, what string) {
	t.Helper()
	require.True(t, want.Equal(got), "%s: got %+v (spot type %+v), want %+v (spot type %+v)", what, got, got.SpotType, want, want.SpotType)
}

// RunTestAggregatePolicy checks how PrepareAggregate consults the capacity
// policy (with the aggregate's TargetAllocation): once
// the target is live, for the target node at the target lifecycle, with the
// request's capacity and the target's reserved and active usage of the
// counters that capacity names; that a prepared aggregate's capacity counts
// as reserved for later decisions; that the record is checked before the
// policy and commit does not consult it.
func RunTestAggregatePolicy(ctx context.Context, t *testing.T, f Factory) {
	spots := func(spots, typed int64) authority.CapacityVector {
		return authority.CapacityVector{Spots: spots, SpotType: &authority.SpotTypeCapacity{ObjectKind: authority.ObjectUserSpot, StableType: DefaultStableType, Count: typed}}
	}
	runSubtests(ctx, t, f, []subtest{
		{"SeesTargetUsage", func(t *testing.T, fx *Fixture) {
			m := newMove(fx)
			fx.Reserve(authority.ObjectActor, "b2", TargetB)
			fx.Active(authority.ObjectUserSpot, "s9", TargetB) // no actor counter
			p := recordPolicy(t, fx, true)
			fx.MustPrepare(m.req)
			c := p.last(t)
			require.Equal(t, NodeB, c.node)
			requireVector(t, m.req.Capacity, c.requested, "requested")
			requireVector(t, authority.CapacityVector{Actors: 1}, c.reserved, "reserved")
			requireVector(t, authority.CapacityVector{Actors: 1, Spots: 1}, c.active, "active")
		}},
		{"SeesSpotTypeUsage", func(t *testing.T, fx *Fixture) {
			s1 := fx.Active(authority.ObjectUserSpot, "s1", TargetA)
			s2 := fx.Active(authority.ObjectUserSpot, "s2", TargetA)
			fx.Active(authority.ObjectUserSpot, "s3", TargetB)
			fx.Reserve(authority.ObjectUserSpot, "s4", TargetB)
			fx.Reserve(authority.ObjectInstanceSpot, "i1", TargetB) // Spots only
			other := fx.ReserveRequest(authority.ObjectUserSpot, "s5", TargetB)
			other.Intent.StableType = "type-b"
			other.Capacity = Capacity(authority.ObjectUserSpot, "type-b")
			fx.MustReserve(other) // Spots only
			req := AggregateRequest("agg-s", 1, TargetB, spots(2, 2),
				Participant(fx.Key(authority.ObjectUserSpot, "s1"), s1.StoreVersion, authority.TransitionNewOwner, nil),
				Participant(fx.Key(authority.ObjectUserSpot, "s2"), s2.StoreVersion, authority.TransitionNewOwner, nil))
			p := recordPolicy(t, fx, true)
			fx.MustPrepare(req)
			c := p.last(t)
			require.Equal(t, NodeB, c.node)
			requireVector(t, req.Capacity, c.requested, "requested")
			requireVector(t, spots(3, 1), c.reserved, "reserved")
			requireVector(t, spots(1, 1), c.active, "active")
		}},
		{"SeesTargetLifecycle", func(t *testing.T, fx *Fixture) {
			m := newMove(fx)
			t2 := Target(NodeB, NodeLifecycle+1, OwnerB)
			fx.SetLive(t2, true)
			req := AggregateRequest("agg-l", 1, t2, authority.CapacityVector{Actors: 1},
				Participant(m.a1Key, m.a1.StoreVersion, authority.TransitionNewOwner, nil))
			p := recordPolicy(t, fx, true)
			fx.MustPrepare(req)
			c := p.last(t)
			require.Equal(t, NodeB, c.node)
			requireVector(t, authority.CapacityVector{}, c.reserved, "reserved at the new lifecycle")
			requireVector(t, authority.CapacityVector{}, c.active, "active at the new lifecycle")
			require.Equal(t, authority.CapacityUsage{Reserved: 1}, fx.Usage(NodeB, NodeLifecycle+1, authority.ObjectActor, ""))
			fx.RequireUsage(NodeB, authority.ObjectActor, "", 1, 0)
		}},
		{"RefusalIsConflict", func(t *testing.T, fx *Fixture) {
			m := newMove(fx)
			p := recordPolicy(t, fx, false)
			before := fx.State()
			require.Equal(t, authority.KindConflict, prepareKind(t, fx, m.req))
			fx.RequireState(before)
			require.Equal(t, NodeB, p.last(t).node)
			require.Equal(t, authority.KindStale, commitAggregateKind(t, fx, m.req.Fence()), "a refused prepare leaves no record")
		}},
		{"PreparedCapacityCountsAsReserved", func(t *testing.T, fx *Fixture) {
			needCapacityPolicy(t, fx)
			m := newMove(fx)
			a2 := fx.Active(authority.ObjectActor, "a2", TargetA)
			fx.H.SetCapacityPolicy(t, ActorLimit(2))
			fence := fx.MustPrepare(m.req) // NodeB: b1 active, a1 reserved
			res, err := fx.Store().Reserve(fx.Ctx(), fx.ReserveRequest(authority.ObjectActor, "b2", TargetB))
			require.NoError(t, err)
			require.Equal(t, authority.KindPlacementCapacityExhausted, res.Kind)
			second := AggregateRequest("agg-2", 1, TargetB, authority.CapacityVector{Actors: 1},
				Participant(fx.Key(authority.ObjectActor, "a2"), a2.StoreVersion, authority.TransitionNewOwner, nil))
			require.Equal(t, authority.KindConflict, prepareKind(t, fx, second))
			require.Equal(t, authority.KindAborted, abortAggregateKind(t, fx, fence))
			fx.MustPrepare(second)
		}},
		{"RecordCheckedBeforePolicy", func(t *testing.T, fx *Fixture) {
			m := newMove(fx)
			fence := fx.MustPrepare(m.req)
			recordPolicy(t, fx, false)
			before := fx.State()
			require.Equal(t, authority.KindAlreadyPrepared, prepareKind(t, fx, m.req))
			fx.RequireState(before)
			// commit consults no policy: the capacity was reserved at prepare
			require.Equal(t, authority.KindCommitted, commitAggregateKind(t, fx, fence))
			require.Equal(t, authority.KindAlreadyCommitted, commitAggregateKind(t, fx, fence))
			fx.RequireUsage(NodeB, authority.ObjectActor, "", 2, 0)
		}},
		{"MixedSpotTypesRejected", func(t *testing.T, fx *Fixture) {
			// AddCapacity refuses newOwner participants that
			// carry two Spot types; nothing is written.
			s1 := fx.Active(authority.ObjectUserSpot, "s1", TargetA)
			other := fx.ReserveRequest(authority.ObjectUserSpot, "s2", TargetA)
			other.Intent.StableType = "type-b"
			other.Capacity = Capacity(authority.ObjectUserSpot, "type-b")
			r2 := fx.MustReserve(other)
			s2 := fx.MustCommit(r2, nil)
			req := AggregateRequest("agg-m", 1, TargetB, spots(2, 2),
				Participant(fx.Key(authority.ObjectUserSpot, "s1"), s1.StoreVersion, authority.TransitionNewOwner, nil),
				Participant(fx.Key(authority.ObjectUserSpot, "s2"), s2.StoreVersion, authority.TransitionNewOwner, nil))
			before := fx.State()
			_, err := fx.Store().PrepareAggregate(fx.Ctx(), req)
			require.ErrorIs(t, err, authority.ErrInvalidArgument)
			require.Contains(t, err.Error(), "Aggregate capacity contains more than one Spot type.")
			fx.RequireState(before)
			require.Equal(t, authority.KindStale, commitAggregateKind(t, fx, req.Fence()))
		}},
	})
}

// RunTestAggregateCommit checks CommitAggregate: every participant or none,
// the owner transition of newOwner participants, capacity moved from source
// to target, alreadyCommitted and the stale cases.
func RunTestAggregateCommit(ctx context.Context, t *testing.T, f Factory) {
	stale := func(t *testing.T, fx *Fixture, fence authority.Fence) {
		t.Helper()
		before := fx.State()
		require.Equal(t, authority.KindStale, commitAggregateKind(t, fx, fence))
		fx.RequireState(before)
	}
	runSubtests(ctx, t, f, []subtest{
		{"Committed", func(t *testing.T, fx *Fixture) {
			m := newMove(fx)
			fence := fx.MustPrepare(m.req)
			require.Equal(t, authority.KindCommitted, commitAggregateKind(t, fx, fence))
			a1 := fx.MustRow(m.a1Key)
			require.Equal(t, []byte("a1-moved"), a1.Payload)
			require.Equal(t, OwnerB, a1.Owner())
			require.Equal(t, NodeB, a1.Allocation.Descriptor)
			require.Equal(t, NodeLifecycle, a1.Allocation.DescriptorLifecycleGeneration)
			require.Equal(t, authority.AllocationActive, a1.Allocation.State)
			require.True(t, m.a1.Allocation.Capacity.Equal(a1.Allocation.Capacity))
			require.NotEqual(t, m.a1.StoreVersion, a1.StoreVersion)
			require.Equal(t, m.a1.ObjectGeneration, a1.ObjectGeneration)
			require.NotEqual(t, m.a1.AuthorityOwnerGeneration, a1.AuthorityOwnerGeneration, "newOwner changes the owner generation")
			b1 := fx.MustRow(m.b1Key)
			require.Equal(t, []byte("b1-kept"), b1.Payload)
			require.Equal(t, OwnerB, b1.Owner())
			require.NotEqual(t, m.b1.StoreVersion, b1.StoreVersion)
			require.Equal(t, m.b1.ObjectGeneration, b1.ObjectGeneration)
			require.Equal(t, m.b1.AuthorityOwnerGeneration, b1.AuthorityOwnerGeneration, "preserve keeps the owner generation")
			require.Equal(t, m.b1.Allocation, b1.Allocation)
		}},
		{"MovesCapacity", func(t *testing.T, fx *Fixture) {
			m := newMove(fx)
			fence := fx.MustPrepare(m.req)
			require.Equal(t, authority.KindCommitted, commitAggregateKind(t, fx, fence))
			fx.RequireUsage(NodeA, authority.ObjectActor, "", 0, 0)
			fx.RequireUsage(NodeB, authority.ObjectActor, "", 2, 0)
		}},
		{"MovesSpotCapacity", func(t *testing.T, fx *Fixture) {
			s1 := fx.Active(authority.ObjectUserSpot, "s1", TargetA)
			capacity := Capacity(authority.ObjectUserSpot, DefaultStableType)
			req := AggregateRequest("agg-s", 1, TargetB, capacity,
				Participant(fx.Key(authority.ObjectUserSpot, "s1"), s1.StoreVersion, authority.TransitionNewOwner, []byte("moved")))
			require.Equal(t, authority.KindCommitted, commitAggregateKind(t, fx, fx.MustPrepare(req)))
			fx.RequireUsage(NodeA, authority.ObjectUserSpot, DefaultStableType, 0, 0)
			fx.RequireUsage(NodeA, authority.CounterSpots, "", 0, 0)
			fx.RequireUsage(NodeB, authority.ObjectUserSpot, DefaultStableType, 1, 0)
			fx.RequireUsage(NodeB, authority.CounterSpots, "", 1, 0)
			s := fx.MustRow(fx.Key(authority.ObjectUserSpot, "s1"))
			require.Equal(t, authority.ObjectUserSpot, s.Allocation.ObjectKind)
			require.Equal(t, DefaultStableType, s.Allocation.StableType)
		}},
		{"MovesMixedCapacity", func(t *testing.T, fx *Fixture) {
			// An Actor and a Spot
			// moved together reserve, then activate, every counter of their
			// summed vector on the target, and release each row's own
			// counters on the source.
			a1 := fx.Active(authority.ObjectActor, "a1", TargetA)
			s1 := fx.Active(authority.ObjectUserSpot, "s1", TargetA)
			fx.Active(authority.ObjectUserSpot, "s2", TargetA)
			keys := []authority.Key{fx.Key(authority.ObjectActor, "a1"), fx.Key(authority.ObjectUserSpot, "s1")}
			capacity := authority.CapacityVector{Actors: 1, Spots: 1, SpotType: &authority.SpotTypeCapacity{ObjectKind: authority.ObjectUserSpot, StableType: DefaultStableType, Count: 1}}
			req := AggregateRequest("agg-mixed", 1, TargetB, capacity,
				Participant(keys[0], a1.StoreVersion, authority.TransitionNewOwner, []byte("a1-moved")),
				Participant(keys[1], s1.StoreVersion, authority.TransitionNewOwner, []byte("s1-moved")))
			fence := fx.MustPrepare(req)
			fx.RequireUsage(NodeB, authority.ObjectActor, "", 0, 1)
			fx.RequireUsage(NodeB, authority.CounterSpots, "", 0, 1)
			fx.RequireUsage(NodeB, authority.ObjectUserSpot, DefaultStableType, 0, 1)
			require.Equal(t, authority.KindCommitted, commitAggregateKind(t, fx, fence))
			fx.RequireUsage(NodeA, authority.ObjectActor, "", 0, 0)
			fx.RequireUsage(NodeA, authority.CounterSpots, "", 1, 0)
			fx.RequireUsage(NodeA, authority.ObjectUserSpot, DefaultStableType, 1, 0)
			fx.RequireUsage(NodeB, authority.ObjectActor, "", 1, 0)
			fx.RequireUsage(NodeB, authority.CounterSpots, "", 1, 0)
			fx.RequireUsage(NodeB, authority.ObjectUserSpot, DefaultStableType, 1, 0)
			for i, was := range []*authority.Snapshot{a1, s1} {
				row := fx.MustRow(keys[i])
				require.Equal(t, OwnerB, row.Owner(), "row %s", keys[i])
				require.Equal(t, NodeB, row.Allocation.Descriptor, "row %s", keys[i])
				require.True(t, was.Allocation.Capacity.Equal(row.Allocation.Capacity), "row %s keeps its own capacity", keys[i])
			}
			// Deleting the moved rows releases their counters on the target.
			for _, k := range keys {
				fx.Delete(k, fx.MustRow(k).StoreVersion)
			}
			for _, c := range []struct {
				kind authority.ObjectKind
				st   string
			}{{authority.ObjectActor, ""}, {authority.CounterSpots, ""}, {authority.ObjectUserSpot, DefaultStableType}} {
				fx.RequireUsage(NodeB, c.kind, c.st, 0, 0)
			}
		}},
		{"AlreadyCommitted", func(t *testing.T, fx *Fixture) {
			m := newMove(fx)
			fence := fx.MustPrepare(m.req)
			require.Equal(t, authority.KindCommitted, commitAggregateKind(t, fx, fence))
			before := fx.State()
			require.Equal(t, authority.KindAlreadyCommitted, commitAggregateKind(t, fx, fence))
			fx.RequireState(before)
		}},
		{"AlreadyCommittedAfterRowsChanged", func(t *testing.T, fx *Fixture) {
			m := newMove(fx)
			fence := fx.MustPrepare(m.req)
			require.Equal(t, authority.KindCommitted, commitAggregateKind(t, fx, fence))
			fx.Put(m.a1Key, fx.MustRow(m.a1Key).StoreVersion, []byte("later"))
			require.Equal(t, authority.KindAlreadyCommitted, commitAggregateKind(t, fx, fence))
		}},
		{"StaleUnknownFence", func(t *testing.T, fx *Fixture) {
			newMove(fx)
			stale(t, fx, authority.Fence{AggregateID: "never-prepared", AggregateGeneration: 1})
		}},
		{"StaleOtherGeneration", func(t *testing.T, fx *Fixture) {
			m := newMove(fx)
			fence := fx.MustPrepare(m.req)
			fence.AggregateGeneration++
			stale(t, fx, fence)
		}},
		{"StaleAfterAbort", func(t *testing.T, fx *Fixture) {
			m := newMove(fx)
			fence := fx.MustPrepare(m.req)
			require.Equal(t, authority.KindAborted, abortAggregateKind(t, fx, fence))
			stale(t, fx, fence)
		}},
		{"StaleParticipantChanged", func(t *testing.T, fx *Fixture) {
			m := newMove(fx)
			fence := fx.MustPrepare(m.req)
			fx.Put(m.a1Key, m.a1.StoreVersion, []byte("changed"))
			stale(t, fx, fence)
			// Still prepared: an abort releases the target's capacity.
			fx.RequireUsage(NodeB, authority.ObjectActor, "", 1, 1)
			require.Equal(t, authority.KindAborted, abortAggregateKind(t, fx, fence))
			fx.RequireUsage(NodeB, authority.ObjectActor, "", 1, 0)
		}},
		{"TwoPreparedOverSameRows", func(t *testing.T, fx *Fixture) {
			// Prepare writes no row and locks none, so two aggregates
			// may be prepared over the same rows (each reserving target
			// capacity); the first commit wins, the second is stale but
			// still prepared, and its abort releases its capacity.
			m := newMove(fx)
			second := m.req.Clone()
			second.AggregateID = "agg-2"
			first := fx.MustPrepare(m.req)
			other := fx.MustPrepare(*second)
			fx.RequireUsage(NodeB, authority.ObjectActor, "", 1, 2)
			require.Equal(t, authority.KindCommitted, commitAggregateKind(t, fx, first))
			fx.RequireUsage(NodeB, authority.ObjectActor, "", 2, 1)
			stale(t, fx, other)
			require.Equal(t, authority.KindAborted, abortAggregateKind(t, fx, other))
			fx.RequireUsage(NodeB, authority.ObjectActor, "", 2, 0)
			fx.RequireUsage(NodeA, authority.ObjectActor, "", 0, 0)
		}},
		{"AllOrNothing", func(t *testing.T, fx *Fixture) {
			m := newMove(fx)
			fence := fx.MustPrepare(m.req)
			// The last participant in key order changes: the first must not move.
			fx.Put(m.b1Key, m.b1.StoreVersion, []byte("changed"))
			stale(t, fx, fence)
			RequireSameRow(t, m.a1, fx.MustRow(m.a1Key))
		}},
		{"StaleParticipantDeleted", func(t *testing.T, fx *Fixture) {
			m := newMove(fx)
			fence := fx.MustPrepare(m.req)
			fx.Delete(m.b1Key, m.b1.StoreVersion)
			stale(t, fx, fence)
		}},
		{"StaleTargetNotLive", func(t *testing.T, fx *Fixture) {
			a1 := fx.Active(authority.ObjectActor, "a1", TargetA)
			req := AggregateRequest("agg-t", 1, TargetB, authority.CapacityVector{Actors: 1},
				Participant(fx.Key(authority.ObjectActor, "a1"), a1.StoreVersion, authority.TransitionNewOwner, nil))
			fence := fx.MustPrepare(req)
			fx.SetLive(TargetB, false)
			stale(t, fx, fence)
		}},
		{"StalePreservedOwnerNotLive", func(t *testing.T, fx *Fixture) {
			m := newMove(fx)
			c := Target(NodeA, NodeLifecycle, authority.OwnerToken{OwnerID: "owner-c", LeaseGeneration: 1})
			fx.SetLive(c, true)
			c1 := fx.Active(authority.ObjectActor, "c1", c)
			req := m.req.Clone()
			req.Participants = append(req.Participants, Participant(fx.Key(authority.ObjectActor, "c1"), c1.StoreVersion, authority.TransitionPreserve, nil))
			fence := fx.MustPrepare(*req)
			fx.SetLive(c, false)
			stale(t, fx, fence)
		}},
		{"CommittedWithDeadSourceOwner", func(t *testing.T, fx *Fixture) {
			m := newMove(fx)
			fence := fx.MustPrepare(m.req)
			fx.SetLive(TargetA, false)
			require.Equal(t, authority.KindCommitted, commitAggregateKind(t, fx, fence))
			require.Equal(t, OwnerB, fx.MustRow(m.a1Key).Owner())
		}},
		{"MovedRowFencedByNewOwner", func(t *testing.T, fx *Fixture) {
			m := newMove(fx)
			require.Equal(t, authority.KindCommitted, commitAggregateKind(t, fx, fx.MustPrepare(m.req)))
			fx.SetLive(TargetA, false)
			moved := fx.Put(m.a1Key, fx.MustRow(m.a1Key).StoreVersion, []byte("by-b"))
			fx.SetLive(TargetB, false)
			res, err := fx.Store().CompareExchangeAuthority(fx.Ctx(), m.a1Key, moved.StoreVersion, authority.Put([]byte("x")))
			require.NoError(t, err)
			require.Equal(t, authority.KindConflict, res.Kind)
		}},
		{"MoveBackChangesOwnerGenerationAgain", func(t *testing.T, fx *Fixture) {
			m := newMove(fx)
			require.Equal(t, authority.KindCommitted, commitAggregateKind(t, fx, fx.MustPrepare(m.req)))
			moved := fx.MustRow(m.a1Key)
			back := AggregateRequest("agg-back", 1, TargetA, authority.CapacityVector{Actors: 1},
				Participant(m.a1Key, moved.StoreVersion, authority.TransitionNewOwner, []byte("back")))
			require.Equal(t, authority.KindCommitted, commitAggregateKind(t, fx, fx.MustPrepare(back)))
			home := fx.MustRow(m.a1Key)
			require.Equal(t, OwnerA, home.Owner())
			require.Equal(t, NodeA, home.Allocation.Descriptor)
			require.NotEqual(t, moved.AuthorityOwnerGeneration, home.AuthorityOwnerGeneration)
			require.Equal(t, m.a1.ObjectGeneration, home.ObjectGeneration, "a move is no re-creation")
			fx.RequireUsage(NodeA, authority.ObjectActor, "", 1, 0)
			fx.RequireUsage(NodeB, authority.ObjectActor, "", 1, 0)
		}},
		{"MovedRowBelongsToNewOwner", func(t *testing.T, fx *Fixture) {
			m := newMove(fx)
			require.Equal(t, authority.KindCommitted, commitAggregateKind(t, fx, fx.MustPrepare(m.req)))
			n, err := fx.Store().RemoveAllByOwner(fx.Ctx(), OwnerA)
			require.NoError(t, err)
			require.Zero(t, n)
			n, err = fx.Store().RemoveAllByOwner(fx.Ctx(), OwnerB)
			require.NoError(t, err)
			require.Equal(t, int64(2), n)
			fx.RequireUsage(NodeB, authority.ObjectActor, "", 0, 0)
		}},
	})
}

// RunTestAggregateAbort checks AbortAggregate: aborted (releasing the
// target's reserved capacity), alreadyAborted and the stale cases.
func RunTestAggregateAbort(ctx context.Context, t *testing.T, f Factory) {
	runSubtests(ctx, t, f, []subtest{
		{"Aborted", func(t *testing.T, fx *Fixture) {
			m := newMove(fx)
			before := fx.State()
			fence := fx.MustPrepare(m.req)
			require.Equal(t, authority.KindAborted, abortAggregateKind(t, fx, fence))
			fx.RequireState(before)
		}},
		{"AlreadyAborted", func(t *testing.T, fx *Fixture) {
			m := newMove(fx)
			fence := fx.MustPrepare(m.req)
			require.Equal(t, authority.KindAborted, abortAggregateKind(t, fx, fence))
			before := fx.State()
			require.Equal(t, authority.KindAlreadyAborted, abortAggregateKind(t, fx, fence))
			fx.RequireState(before)
		}},
		{"StaleUnknownFence", func(t *testing.T, fx *Fixture) {
			before := fx.State()
			require.Equal(t, authority.KindStale, abortAggregateKind(t, fx, authority.Fence{AggregateID: "never", AggregateGeneration: 1}))
			fx.RequireState(before)
		}},
		{"StaleAfterCommit", func(t *testing.T, fx *Fixture) {
			m := newMove(fx)
			fence := fx.MustPrepare(m.req)
			require.Equal(t, authority.KindCommitted, commitAggregateKind(t, fx, fence))
			before := fx.State()
			require.Equal(t, authority.KindStale, abortAggregateKind(t, fx, fence))
			fx.RequireState(before)
		}},
		{"AbortedReleasesSpotCapacity", func(t *testing.T, fx *Fixture) {
			// AbortAggregate releases every counter of the target
			// allocation, Spot counters included.
			s1 := fx.Active(authority.ObjectUserSpot, "s1", TargetA)
			before := fx.State()
			req := AggregateRequest("agg-s", 1, TargetB, Capacity(authority.ObjectUserSpot, DefaultStableType),
				Participant(fx.Key(authority.ObjectUserSpot, "s1"), s1.StoreVersion, authority.TransitionNewOwner, nil))
			fence := fx.MustPrepare(req)
			fx.RequireUsage(NodeB, authority.ObjectUserSpot, DefaultStableType, 0, 1)
			fx.RequireUsage(NodeB, authority.CounterSpots, "", 0, 1)
			require.Equal(t, authority.KindAborted, abortAggregateKind(t, fx, fence))
			fx.RequireState(before)
		}},
		{"AbortedWithTargetDead", func(t *testing.T, fx *Fixture) {
			m := newMove(fx)
			fence := fx.MustPrepare(m.req)
			fx.SetLive(TargetB, false)
			require.Equal(t, authority.KindAborted, abortAggregateKind(t, fx, fence))
			fx.RequireUsage(NodeB, authority.ObjectActor, "", 1, 0)
		}},
		{"CommitAfterAbortIsStale", func(t *testing.T, fx *Fixture) {
			m := newMove(fx)
			fence := fx.MustPrepare(m.req)
			require.Equal(t, authority.KindAborted, abortAggregateKind(t, fx, fence))
			require.Equal(t, authority.KindStale, commitAggregateKind(t, fx, fence))
			RequireSameRow(t, m.a1, fx.MustRow(m.a1Key))
		}},
	})
}
