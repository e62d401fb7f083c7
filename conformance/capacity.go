package conformance

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
)

// RunTestCapacity checks capacity accounting (CapacityUsage per counter,
// node and lifecycle generation) and exhaustion through the capacity policy.
func RunTestCapacity(ctx context.Context, t *testing.T, f Factory) {
	runSubtests(ctx, t, f, []subtest{
		{"ZeroWhenEmpty", func(t *testing.T, fx *Fixture) {
			for _, u := range fx.State().Usage {
				require.Equal(t, authority.CapacityUsage{}, u)
			}
		}},
		{"ReserveCountsReserved", func(t *testing.T, fx *Fixture) {
			fx.Reserve(authority.ObjectActor, "a1", TargetA)
			fx.Reserve(authority.ObjectActor, "a2", TargetA)
			fx.RequireUsage(NodeA, authority.ObjectActor, "", 0, 2)
			fx.RequireUsage(NodeA, authority.CounterSpots, "", 0, 0)
		}},
		{"CommitMovesReservedToActive", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectUserSpot, "s1", TargetA)
			fx.Reserve(authority.ObjectUserSpot, "s2", TargetA)
			fx.MustCommit(r, nil)
			fx.RequireUsage(NodeA, authority.ObjectUserSpot, DefaultStableType, 1, 1)
			fx.RequireUsage(NodeA, authority.CounterSpots, "", 1, 1)
		}},
		{"CompletionMovesReservedToActive", func(t *testing.T, fx *Fixture) {
			fx.Active(authority.ObjectActor, "a1", TargetA)
			fx.RequireUsage(NodeA, authority.ObjectActor, "", 1, 0)
		}},
		{"SpotCountersPerType", func(t *testing.T, fx *Fixture) {
			req := fx.ReserveRequest(authority.ObjectUserSpot, "s1", TargetA)
			req.Intent.StableType = "type-b"
			req.Capacity = Capacity(authority.ObjectUserSpot, "type-b")
			fx.MustReserve(req)
			fx.Reserve(authority.ObjectUserSpot, "s2", TargetA)
			fx.Reserve(authority.ObjectInstanceSpot, "i1", TargetA)
			fx.RequireUsage(NodeA, authority.ObjectUserSpot, "type-b", 0, 1)
			fx.RequireUsage(NodeA, authority.ObjectUserSpot, DefaultStableType, 0, 1)
			fx.RequireUsage(NodeA, authority.ObjectInstanceSpot, DefaultStableType, 0, 1)
			fx.RequireUsage(NodeA, authority.CounterSpots, "", 0, 3)
			fx.RequireUsage(NodeA, "some_other_kind", "ignored", 0, 3)
			fx.RequireUsage(NodeA, authority.ObjectActor, "", 0, 0)
		}},
		{"CountsPerNodeAndLifecycle", func(t *testing.T, fx *Fixture) {
			t2 := Target(NodeA, NodeLifecycle+1, OwnerA)
			fx.SetLive(t2, true)
			fx.Active(authority.ObjectActor, "a1", TargetA)
			fx.Reserve(authority.ObjectActor, "a2", t2)
			fx.RequireUsage(NodeA, authority.ObjectActor, "", 1, 0)
			require.Equal(t, authority.CapacityUsage{Reserved: 1}, fx.Usage(NodeA, NodeLifecycle+1, authority.ObjectActor, ""))
			fx.RequireUsage(NodeB, authority.ObjectActor, "", 0, 0)
		}},
		{"CountsVectorSize", func(t *testing.T, fx *Fixture) {
			req := fx.ReserveRequest(authority.ObjectUserSpot, "s1", TargetA)
			req.Capacity = authority.CapacityVector{Actors: 2, Spots: 3, SpotType: &authority.SpotTypeCapacity{ObjectKind: authority.ObjectUserSpot, StableType: DefaultStableType, Count: 4}}
			r := fx.MustReserve(req)
			fx.RequireUsage(NodeA, authority.ObjectActor, "", 0, 2)
			fx.RequireUsage(NodeA, authority.CounterSpots, "", 0, 3)
			fx.RequireUsage(NodeA, authority.ObjectUserSpot, DefaultStableType, 0, 4)
			fx.MustCommit(r, nil)
			fx.RequireUsage(NodeA, authority.ObjectActor, "", 2, 0)
			fx.RequireUsage(NodeA, authority.CounterSpots, "", 3, 0)
			fx.RequireUsage(NodeA, authority.ObjectUserSpot, DefaultStableType, 4, 0)
		}},
		{"DeleteReleasesActive", func(t *testing.T, fx *Fixture) {
			s := fx.Active(authority.ObjectActor, "a1", TargetA)
			fx.Delete(fx.Key(authority.ObjectActor, "a1"), s.StoreVersion)
			fx.RequireUsage(NodeA, authority.ObjectActor, "", 0, 0)
		}},
		{"Exhaustion", func(t *testing.T, fx *Fixture) {
			needCapacityPolicy(t, fx)
			fx.H.SetCapacityPolicy(t, ActorLimit(2))
			fx.Active(authority.ObjectActor, "a1", TargetA)
			r := fx.Reserve(authority.ObjectActor, "a2", TargetA)
			res, err := fx.Store().Reserve(fx.Ctx(), fx.ReserveRequest(authority.ObjectActor, "a3", TargetA))
			require.NoError(t, err)
			require.Equal(t, authority.KindPlacementCapacityExhausted, res.Kind, "one active and one reserved fill a limit of two")
			// Other nodes have their own capacity.
			fx.Reserve(authority.ObjectActor, "b1", TargetB)
			// Releasing the reservation makes room again.
			ab, err := fx.Store().Abort(fx.Ctx(), r.AbortRequest())
			require.NoError(t, err)
			require.Equal(t, authority.KindAborted, ab.Kind)
			fx.Reserve(authority.ObjectActor, "a3", TargetA)
		}},
		{"PolicySeesUsage", func(t *testing.T, fx *Fixture) {
			needCapacityPolicy(t, fx)
			fx.Active(authority.ObjectUserSpot, "s1", TargetA)
			fx.Reserve(authority.ObjectUserSpot, "s2", TargetA)
			fx.Reserve(authority.ObjectActor, "a1", TargetA)
			type call struct {
				node                        authority.NodeDescriptor
				requested, reserved, active authority.CapacityVector
			}
			var mu sync.Mutex
			var calls []call
			fx.H.SetCapacityPolicy(t, CapacityPolicyFunc(func(node authority.NodeDescriptor, requested, reserved, active authority.CapacityVector) bool {
				mu.Lock()
				defer mu.Unlock()
				calls = append(calls, call{node, requested.Clone(), reserved.Clone(), active.Clone()})
				return true
			}))
			req := fx.ReserveRequest(authority.ObjectUserSpot, "s3", TargetA)
			fx.MustReserve(req)
			mu.Lock()
			defer mu.Unlock()
			require.NotEmpty(t, calls)
			last := calls[len(calls)-1]
			require.Equal(t, NodeA, last.node)
			require.True(t, req.Capacity.Equal(last.requested))
			spot := func(spots, typed int64) authority.CapacityVector {
				return authority.CapacityVector{Spots: spots, SpotType: &authority.SpotTypeCapacity{ObjectKind: authority.ObjectUserSpot, StableType: DefaultStableType, Count: typed}}
			}
			reserved := spot(1, 1)
			reserved.Actors = 1
			require.True(t, reserved.Equal(last.reserved), "reserved %+v %+v", last.reserved, last.reserved.SpotType)
			require.True(t, spot(1, 1).Equal(last.active), "active %+v %+v", last.active, last.active.SpotType)
		}},
		{"PolicyWithoutSpotTypeSeesNoSpotType", func(t *testing.T, fx *Fixture) {
			needCapacityPolicy(t, fx)
			fx.Active(authority.ObjectActor, "a1", TargetA)
			var mu sync.Mutex
			var got []authority.CapacityVector
			fx.H.SetCapacityPolicy(t, CapacityPolicyFunc(func(_ authority.NodeDescriptor, _, reserved, active authority.CapacityVector) bool {
				mu.Lock()
				defer mu.Unlock()
				got = append(got, reserved.Clone(), active.Clone())
				return true
			}))
			fx.Reserve(authority.ObjectActor, "a2", TargetA)
			mu.Lock()
			defer mu.Unlock()
			require.NotEmpty(t, got)
			reserved, active := got[len(got)-2], got[len(got)-1]
			require.True(t, authority.CapacityVector{}.Equal(reserved), "reserved %+v", reserved)
			require.True(t, authority.CapacityVector{Actors: 1}.Equal(active), "active %+v", active)
		}},
	})
}
