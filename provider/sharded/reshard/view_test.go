package reshard_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/provider/sharded/reshard"
	"github.com/zlink-systems/authority/view"
)

// TestViewFollowsAResharding: a view over a store of one shard keeps
// answering across a resharding: its feed ends at the switch (the map's
// shards changed), it lists again under the grown map, and a consistent
// read from memory sees a row written in the new shard after the switch
// and a moved row's value.
func TestViewFollowsAResharding(t *testing.T) {
	ctx := context.Background()
	cs := clusters(t)
	s := openStore(t, cs, 1, 1, nil)
	lease, err := s.Registry().Acquire(ctx, conformance.NodeA, 1, "viewed", 20*time.Second)
	require.NoError(t, err)
	defer func() { _ = lease.Close(ctx) }()
	fx := conformance.NewFixture(t, harness(s, nil))
	target := conformance.Target(conformance.NodeA, 1, lease.Token())
	moved := movingID(t, "moved", 1)
	row := fx.Active(authority.ObjectUserSpot, moved, target)
	v, err := view.New(ctx, s, view.Config{})
	require.NoError(t, err)
	defer func() { _ = v.Close() }()
	read, err := v.ReadAuthority(ctx, fx.Key(authority.ObjectUserSpot, moved))
	require.NoError(t, err)
	require.Equal(t, row.Payload, read.Snapshot.Payload)

	grow(t, cs, 1, func(c *reshard.Config) { c.LeaseWait = 100 * time.Millisecond })
	key := fx.Key(authority.ObjectUserSpot, moved)
	res, err := s.CompareExchangeAuthority(ctx, key, row.StoreVersion, authority.Put([]byte("after the switch")))
	require.NoError(t, err)
	require.Equal(t, authority.KindStored, res.Kind)
	later := fx.Active(authority.ObjectUserSpot, movingID(t, "later", 1), target)
	require.Eventually(t, func() bool {
		r, err := v.Read(ctx, key, view.Freshness{})
		if err != nil || r.Snapshot == nil || string(r.Snapshot.Payload) != "after the switch" || r.FromStore {
			return false
		}
		r, err = v.Read(ctx, fx.Key(authority.ObjectUserSpot, movingID(t, "later", 1)), view.Freshness{})
		return err == nil && r.Snapshot != nil && string(r.Snapshot.Payload) == string(later.Payload) && !r.FromStore
	}, time.Minute, 50*time.Millisecond, "the view did not serve the grown map from memory")
}
