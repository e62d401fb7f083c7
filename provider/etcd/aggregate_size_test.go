package etcd_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
)

// An aggregate whose commit cannot be sent is refused at prepare, writing
// nothing: the commit carries the finished aggregate record, which repeats
// every payload, so one 800 KiB participant needs more than the default
// 1.5 MiB request (it was prepared, then every commit was ErrLimitExceeded).
func TestPrepareAggregateRefusesACommitThatCannotBeSent(t *testing.T) {
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, nil, etcdstore.Config{Clock: clock}) // default limits
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	a1 := fx.Active(authority.ObjectActor, "a1", conformance.TargetA)
	req := conformance.AggregateRequest("big", 1, conformance.TargetB, authority.CapacityVector{Actors: 1},
		conformance.Participant(fx.Key(authority.ObjectActor, "a1"), a1.StoreVersion, authority.TransitionNewOwner, make([]byte, 800<<10)))
	before := fx.State()
	res, err := s.PrepareAggregate(context.Background(), req)
	require.ErrorIs(t, err, authority.ErrLimitExceeded, "prepare answered %+v", res)
	fx.RequireState(before)
	// one that fits still prepares and commits
	small := conformance.AggregateRequest("small", 1, conformance.TargetB, authority.CapacityVector{Actors: 1},
		conformance.Participant(fx.Key(authority.ObjectActor, "a1"), a1.StoreVersion, authority.TransitionNewOwner, make([]byte, 600<<10)))
	fence := fx.MustPrepare(small)
	done, err := s.CommitAggregate(context.Background(), fence)
	require.NoError(t, err)
	require.Equal(t, authority.KindCommitted, done.Kind)
}
