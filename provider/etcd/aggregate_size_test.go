package etcd_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The commit of an aggregate carries each payload once, in its row: the
// finished record keeps no payloads. So one 800 KiB participant prepares and
// commits under the default 1.5 MiB request (it used to be refused: the
// finished record repeated the payload). An aggregate whose prepared record
// (which holds every payload) cannot be sent is refused at prepare, writing
// nothing.
func TestAggregateSizeLimits(t *testing.T) {
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, nil, etcdstore.Config{Clock: clock}) // default limits
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	a1 := fx.Active(authority.ObjectActor, "a1", conformance.TargetA)
	b1 := fx.Active(authority.ObjectActor, "b1", conformance.TargetA)
	a1Key, b1Key := fx.Key(authority.ObjectActor, "a1"), fx.Key(authority.ObjectActor, "b1")

	two := conformance.AggregateRequest("two", 1, conformance.TargetB, authority.CapacityVector{Actors: 2},
		conformance.Participant(a1Key, a1.StoreVersion, authority.TransitionNewOwner, make([]byte, 700<<10)),
		conformance.Participant(b1Key, b1.StoreVersion, authority.TransitionNewOwner, make([]byte, 700<<10)))
	before := fx.State()
	res, err := s.PrepareAggregate(context.Background(), two)
	require.ErrorIs(t, err, authority.ErrLimitExceeded, "prepare answered %+v", res)
	fx.RequireState(before)

	big := conformance.AggregateRequest("big", 1, conformance.TargetB, authority.CapacityVector{Actors: 1},
		conformance.Participant(a1Key, a1.StoreVersion, authority.TransitionNewOwner, make([]byte, 800<<10)))
	fence := fx.MustPrepare(big)
	done, err := s.CommitAggregate(context.Background(), fence)
	require.NoError(t, err)
	require.Equal(t, authority.KindCommitted, done.Kind)
	rec, err := shared.Get(context.Background(), schema.Prefix(s.Namespace(), schema.EntryAggregate), clientv3.WithPrefix())
	require.NoError(t, err)
	require.Len(t, rec.Kvs, 1)
	require.Less(t, len(rec.Kvs[0].Value), 4<<10, "the finished record keeps no payload")
	again, err := s.CommitAggregate(context.Background(), fence)
	require.NoError(t, err)
	require.Equal(t, authority.KindAlreadyCommitted, again.Kind)
}
