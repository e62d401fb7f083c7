package escrow_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
)

// TestEscrowLimitHoldsAcrossShards: one after another, reservations on the
// three shards in turn fill the node to its limit exactly, and the next is
// exhausted on every shard; freeing one slot in one shard lets a
// reservation in another shard take it (its slack is reclaimed).
func TestEscrowLimitHoldsAcrossShards(t *testing.T) {
	const limit = 10
	set := openShards(t, "", setOptions{policy: conformance.ActorLimit(limit)})
	ctx := context.Background()
	var first authority.ReserveResult
	var firstReq authority.ReserveRequest
	for i := range limit {
		req := reserveRequest(authority.ObjectActor, fmt.Sprintf("a%d", i))
		res, err := set.stores[i%shardCount].Reserve(ctx, req)
		require.NoError(t, err)
		require.Equal(t, authority.KindReserved, res.Kind, "reservation %d", i)
		if i == 0 {
			first, firstReq = res, req
		}
	}
	for s := range shardCount {
		res, err := set.stores[s].Reserve(ctx, reserveRequest(authority.ObjectActor, fmt.Sprintf("over-%d", s)))
		require.NoError(t, err)
		require.Equal(t, authority.KindPlacementCapacityExhausted, res.Kind, "shard %d", s)
	}
	_, reserved := set.usage(t, authority.ObjectActor)
	require.Equal(t, int64(limit), reserved)

	// free one slot in shard 0; shard 2 takes it
	key, err := firstReq.Key.Encode()
	require.NoError(t, err)
	ab, err := set.stores[0].Abort(ctx, authority.AbortRequest{Key: firstReq.Key, ReservationID: first.ReservationID,
		ExpectedStoreVersion: first.Creating.StoreVersion, Target: target})
	require.NoError(t, err)
	require.Equal(t, authority.KindAborted, ab.Kind, "abort %s", key)
	res, err := set.stores[2].Reserve(ctx, reserveRequest(authority.ObjectActor, "late"))
	require.NoError(t, err)
	require.Equal(t, authority.KindReserved, res.Kind)
	res, err = set.stores[1].Reserve(ctx, reserveRequest(authority.ObjectActor, "later"))
	require.NoError(t, err)
	require.Equal(t, authority.KindPlacementCapacityExhausted, res.Kind)
	_, reserved = set.usage(t, authority.ObjectActor)
	require.Equal(t, int64(limit), reserved)
	set.requireSettled(t, false)
}
