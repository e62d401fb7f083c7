package memory

import (
	"testing"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
)

// moveRequest moves the given rows to owner B on node B, keeping preserved
// as preserve participants.
func moveRequest(gen int64, moved, preserved map[authority.Key]*authority.Snapshot) authority.AggregatePrepareRequest {
	req := authority.AggregatePrepareRequest{
		AggregateID: "agg", AggregateGeneration: gen,
		TargetOwner: ownerB, TargetDescriptor: nodeB, TargetDescriptorLifecycleGeneration: 1,
		InventoryDigest: digest("inventory"),
	}
	var total authority.CapacityVector
	add := func(key authority.Key, s *authority.Snapshot, transition authority.GenerationTransition) {
		req.Participants = append(req.Participants, authority.AggregateParticipant{
			AuthorityKey: key, ExpectedStoreVersion: s.StoreVersion, OwnerTransition: transition,
			AuthorityPayload: []byte("moved:" + string(key)), MembershipMutation: []byte("m"),
		})
	}
	for k, s := range moved {
		add(k, s, authority.TransitionNewOwner)
		total, _ = authority.AddCapacity(total, s.Allocation.Capacity)
	}
	for k, s := range preserved {
		add(k, s, authority.TransitionPreserve)
	}
	sortParticipants(req.Participants)
	req.Capacity = total
	return req
}

func sortParticipants(ps []authority.AggregateParticipant) {
	for i := 1; i < len(ps); i++ {
		for j := i; j > 0 && ps[j].AuthorityKey < ps[j-1].AuthorityKey; j-- {
			ps[j], ps[j-1] = ps[j-1], ps[j]
		}
	}
}

func (e *env) prepare(req authority.AggregatePrepareRequest) authority.ResultKind {
	e.t.Helper()
	res, err := e.s.PrepareAggregate(e.ctx, req)
	require.NoError(e.t, err)
	if res.Kind == authority.KindPrepared || res.Kind == authority.KindAlreadyPrepared {
		require.Equal(e.t, req.Fence(), res.Fence)
	}
	return res.Kind
}

func (e *env) commitAggregate(f authority.Fence) authority.ResultKind {
	e.t.Helper()
	res, err := e.s.CommitAggregate(e.ctx, f)
	require.NoError(e.t, err)
	return res.Kind
}

func (e *env) abortAggregate(f authority.Fence) authority.ResultKind {
	e.t.Helper()
	res, err := e.s.AbortAggregate(e.ctx, f)
	require.NoError(e.t, err)
	return res.Kind
}

func TestAggregateCommit(t *testing.T) {
	e := newEnv(t)
	k1, s1 := e.spot("s1")
	k2, s2 := e.spot("s2")
	k3, s3 := e.spot("s3")
	req := moveRequest(1, map[authority.Key]*authority.Snapshot{k1: s1, k2: s2}, map[authority.Key]*authority.Snapshot{k3: s3})
	require.Equal(t, authority.KindPrepared, e.prepare(req))
	require.Equal(t, authority.KindAlreadyPrepared, e.prepare(req))
	require.Equal(t, authority.CapacityUsage{Active: 3}, e.usage(nodeA, authority.ObjectUserSpot, "chat"))
	require.Equal(t, authority.CapacityUsage{Reserved: 2}, e.usage(nodeB, authority.ObjectUserSpot, "chat"))
	changed := req
	changed.InventoryDigest = digest("other")
	require.Equal(t, authority.KindConflict, e.prepare(changed))

	require.Equal(t, authority.KindCommitted, e.commitAggregate(req.Fence()))
	require.Equal(t, authority.CapacityUsage{Active: 1}, e.usage(nodeA, authority.ObjectUserSpot, "chat"))
	require.Equal(t, authority.CapacityUsage{Active: 2}, e.usage(nodeB, authority.ObjectUserSpot, "chat"))
	for k, before := range map[authority.Key]*authority.Snapshot{k1: s1, k2: s2} {
		after := e.read(k).Snapshot
		require.Equal(t, ownerB, after.Owner())
		require.Equal(t, nodeB, after.Allocation.Descriptor)
		require.NotEqual(t, before.AuthorityOwnerGeneration, after.AuthorityOwnerGeneration)
		require.Equal(t, before.ObjectGeneration, after.ObjectGeneration)
		require.NotEqual(t, before.StoreVersion, after.StoreVersion)
		require.Equal(t, []byte("moved:"+string(k)), after.Payload)
	}
	kept := e.read(k3).Snapshot
	require.Equal(t, ownerA, kept.Owner())
	require.Equal(t, s3.AuthorityOwnerGeneration, kept.AuthorityOwnerGeneration)
	require.NotEqual(t, s3.StoreVersion, kept.StoreVersion)

	before := e.state()
	require.Equal(t, authority.KindAlreadyCommitted, e.commitAggregate(req.Fence()))
	require.Equal(t, authority.KindStale, e.abortAggregate(req.Fence()))
	require.Equal(t, authority.KindStale, e.prepare(req))
	require.Equal(t, before, e.state())
}

func TestAggregateAbort(t *testing.T) {
	e := newEnv(t)
	k1, s1 := e.spot("s1")
	req := moveRequest(1, map[authority.Key]*authority.Snapshot{k1: s1}, nil)
	require.Equal(t, authority.KindStale, e.abortAggregate(req.Fence()))
	require.Equal(t, authority.KindStale, e.commitAggregate(req.Fence()))
	require.Equal(t, authority.KindPrepared, e.prepare(req))
	require.Equal(t, authority.KindAborted, e.abortAggregate(req.Fence()))
	require.Equal(t, authority.KindAlreadyAborted, e.abortAggregate(req.Fence()))
	require.Equal(t, authority.KindStale, e.commitAggregate(req.Fence()))
	require.Equal(t, authority.KindConflict, e.prepare(req))
	require.Equal(t, authority.CapacityUsage{}, e.usage(nodeB, authority.ObjectUserSpot, "chat"))
	require.Equal(t, s1.StoreVersion, e.read(k1).Snapshot.StoreVersion)
}

func TestAggregatePrepareConflicts(t *testing.T) {
	e := newEnv(t)
	k1, s1 := e.spot("s1")
	k2, s2 := e.spot("s2")
	moved := map[authority.Key]*authority.Snapshot{k1: s1}
	kept := map[authority.Key]*authority.Snapshot{k2: s2}

	e.live.Set(nodeB, 1, ownerB, false)
	require.Equal(t, authority.KindConflict, e.prepare(moveRequest(1, moved, kept)), "dead target")
	e.live.Set(nodeB, 1, ownerB, true)

	e.s.SetCapacityPolicy(policyFunc(func(node authority.NodeDescriptor, _, _, _ authority.CapacityVector) bool { return node != nodeB }))
	require.Equal(t, authority.KindConflict, e.prepare(moveRequest(1, moved, kept)), "no capacity")
	e.s.SetCapacityPolicy(nil)

	wrongCapacity := moveRequest(1, moved, kept)
	wrongCapacity.Capacity.Spots = 2
	require.Equal(t, authority.KindConflict, e.prepare(wrongCapacity), "capacity mismatch")

	staleVersion := moveRequest(1, moved, kept)
	staleVersion.Participants[0].ExpectedStoreVersion = "0"
	require.Equal(t, authority.KindConflict, e.prepare(staleVersion), "stale participant")

	e.live.Set(nodeA, 1, ownerA, false)
	require.Equal(t, authority.KindConflict, e.prepare(moveRequest(1, moved, kept)), "dead preserve owner")
	e.live.Set(nodeA, 1, ownerA, true)

	// Mixing two Spot types is invalid.
	k3, s3 := e.spot("s3")
	e.s.mu.Lock()
	r := e.s.row(k3).successor()
	e.s.setAllocation(r, authority.PlacementAllocation{
		State: authority.AllocationActive, ObjectKind: authority.ObjectUserSpot, StableType: "mail",
		Descriptor: nodeA, DescriptorLifecycleGeneration: 1,
		Capacity: authority.CapacityVector{Spots: 1, SpotType: &authority.SpotTypeCapacity{ObjectKind: authority.ObjectUserSpot, StableType: "mail", Count: 1}},
	})
	e.s.index.Set(r)
	e.s.mu.Unlock()
	mixed := moveRequest(1, map[authority.Key]*authority.Snapshot{k1: s1, k3: s3}, nil)
	_, err := e.s.PrepareAggregate(e.ctx, mixed)
	require.ErrorIs(t, err, authority.ErrInvalidArgument)

	require.Equal(t, 0, e.state().aggregates)
	require.Equal(t, authority.CapacityUsage{}, e.usage(nodeB, authority.ObjectUserSpot, "chat"))
}

func TestAggregateCommitStale(t *testing.T) {
	e := newEnv(t)
	k1, s1 := e.spot("s1")
	k2, s2 := e.spot("s2")
	req := moveRequest(1, map[authority.Key]*authority.Snapshot{k1: s1}, map[authority.Key]*authority.Snapshot{k2: s2})
	require.Equal(t, authority.KindPrepared, e.prepare(req))

	e.live.Set(nodeB, 1, ownerB, false)
	require.Equal(t, authority.KindStale, e.commitAggregate(req.Fence()), "dead target")
	e.live.Set(nodeB, 1, ownerB, true)
	e.live.Set(nodeA, 1, ownerA, false)
	require.Equal(t, authority.KindStale, e.commitAggregate(req.Fence()), "dead preserve owner")
	e.live.Set(nodeA, 1, ownerA, true)

	before := e.state()
	res := e.cas(k2, s2.StoreVersion, authority.Put([]byte("changed")))
	require.Equal(t, authority.KindStored, res.Kind)
	require.Equal(t, authority.KindStale, e.commitAggregate(req.Fence()), "participant changed")
	// Nothing of the aggregate applied: row 1 is untouched.
	require.Equal(t, s1.StoreVersion, e.read(k1).Snapshot.StoreVersion)
	require.Equal(t, before.counters, e.state().counters)
	// It can still be aborted, releasing the target's capacity.
	require.Equal(t, authority.KindAborted, e.abortAggregate(req.Fence()))
	require.Equal(t, authority.CapacityUsage{}, e.usage(nodeB, authority.ObjectUserSpot, "chat"))
}
