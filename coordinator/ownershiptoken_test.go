package coordinator_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/coordinator"
)

// testOwnershipTokenHandOff: the code a coordinator runs gets the Spot's
// fencing token without reading the store — a created User Spot in its
// materialize call and its ready route, an activated Instance Spot in its
// reservation and its route — and it is the token of the Ready row.
func testOwnershipTokenHandOff(t *testing.T, f Factory) {
	e := newEnv(t, f)
	var routed coordinator.ReadyRoute
	c, _ := newCoordinator(t, e.h.Store, coordinator.UserSpotOptions{
		PublishReadyRoute: func(_ string, r coordinator.ReadyRoute) { routed = r },
	}, localTarget())
	var handed int64
	materialize := func(_ context.Context, _ coordinator.Target, creating *authority.Snapshot) (coordinator.Materialized, error) {
		handed = creating.OwnershipToken
		return coordinator.Materialized{State: coordinator.Created}, nil
	}
	res, err := c.GetOrCreate(e.ctx, request("token-spot"), materialize, func(context.Context) error { return nil })
	require.NoError(t, err)
	require.Equal(t, coordinator.Created, res.State)
	ready := requireReadyUserSpot(t, e, "token-spot")
	require.Positive(t, ready.OwnershipToken)
	require.Equal(t, ready.OwnershipToken, handed, "materialize gets the token the Ready row keeps")
	require.Equal(t, ready.OwnershipToken, routed.OwnershipToken, "the ready route carries it")

	ie := newInstanceEnv(t, f)
	a := ie.authority(t)
	target := instanceTarget("token-inst")
	out, err := a.Reserve(ie.ctx, activation("token-inst"))
	require.NoError(t, err)
	require.Equal(t, coordinator.ReserveReserved, out.Kind)
	reserved, _ := ie.instancePayload(t, "token-inst")
	require.Positive(t, out.Reservation.OwnershipToken)
	require.Equal(t, reserved.OwnershipToken, out.Reservation.OwnershipToken)
	pending, ok := coordinator.PendingActivationOf(reserved)
	require.True(t, ok)
	require.Equal(t, reserved.OwnershipToken, pending.OwnershipToken)
	committed, err := a.Commit(ie.ctx, target, out.Reservation, spotOf(target, out.Reservation))
	require.NoError(t, err)
	require.Equal(t, coordinator.CommitCommitted, committed.Kind)
	row, _ := ie.instancePayload(t, "token-inst")
	require.Equal(t, out.Reservation.OwnershipToken, committed.Route.OwnershipToken, "a commit keeps the token")
	require.Equal(t, row.OwnershipToken, committed.Route.OwnershipToken)
}
