package twophase_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/provider/sharded/twophase"
)

// BenchmarkAggregateCommit measures a prepare and a commit of an aggregate
// of three Spots (one moving between NodeA and NodeB each time, two kept),
// after reading the three rows' versions: with the rows and the record in
// one shard (shards=1: one Txn each, as in one store) and with the rows in
// three shards (shards=3: the two-phase protocol), on the same embedded
// clusters in one run.
func BenchmarkAggregateCommit(b *testing.B) {
	for _, tc := range []struct {
		name   string
		router func() twophase.Router
	}{
		{"shards=1", func() twophase.Router { return oneShard{} }},
		{"shards=3", func() twophase.Router { return newRoundRobin(shardCount) }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			ctx := context.Background()
			h, _, in := newHarness(b, tc.router(), false)
			fx := conformance.NewFixture(b, h)
			var keys []authority.Key
			for i := range 3 {
				fx.Active(authority.ObjectUserSpot, fmt.Sprintf("r%d", i), conformance.TargetA)
				keys = append(keys, fx.Key(authority.ObjectUserSpot, fmt.Sprintf("r%d", i)))
			}
			targets := []authority.CreationTarget{conformance.TargetB, conformance.TargetA}
			for i := 0; b.Loop(); i++ {
				parts := make([]authority.AggregateParticipant, len(keys))
				for j, k := range keys {
					res, err := in.storeOf(k).ReadAuthority(ctx, k)
					require.NoError(b, err)
					transition := authority.TransitionPreserve
					if j == 0 {
						transition = authority.TransitionNewOwner
					}
					parts[j] = conformance.Participant(k, res.Snapshot.StoreVersion, transition, []byte(fmt.Sprint(i)))
				}
				req := conformance.AggregateRequest(fmt.Sprintf("bench-%d", i), 1, targets[i%2],
					conformance.Capacity(authority.ObjectUserSpot, conformance.DefaultStableType), parts...)
				prep, err := in.coord.PrepareAggregate(ctx, req)
				require.NoError(b, err)
				require.Equal(b, authority.KindPrepared, prep.Kind)
				res, err := in.coord.CommitAggregate(ctx, prep.Fence)
				require.NoError(b, err)
				require.Equal(b, authority.KindCommitted, res.Kind)
			}
		})
	}
}
