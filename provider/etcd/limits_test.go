package etcd_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
)

// activeRows places n active actors on NodeA and returns aggregate
// participants moving them (newOwner).
func activeRows(fx *conformance.Fixture, n int) []authority.AggregateParticipant {
	parts := make([]authority.AggregateParticipant, n)
	for i := range parts {
		snap := fx.Active(authority.ObjectActor, fmt.Sprintf("row-%03d", i), conformance.TargetA)
		parts[i] = conformance.Participant(fx.Key(authority.ObjectActor, fmt.Sprintf("row-%03d", i)), snap.StoreVersion, authority.TransitionNewOwner, []byte("moved"))
	}
	return parts
}

func requireLimit(t *testing.T, err error, flag string) {
	t.Helper()
	require.Error(t, err)
	require.True(t, errors.Is(err, authority.ErrLimitExceeded), "want ErrLimitExceeded, got %v", err)
	require.Contains(t, err.Error(), flag)
}

func TestAggregateOverTxnLimitIsRefusedBeforeSending(t *testing.T) {
	h := etcdFactory(t)
	fx := conformance.NewFixture(t, h)
	// 25 newOwner participants leaving one node need 5·25 + 3 + 1 = 129 ops > 128
	parts := activeRows(fx, 25)
	before := fx.State()
	req := conformance.AggregateRequest("too-big", 1, conformance.TargetB, authority.CapacityVector{Actors: 25}, parts...)
	_, err := fx.Store().PrepareAggregate(fx.Ctx(), req)
	requireLimit(t, err, "--max-txn-ops")
	fx.RequireState(before)
	_, err = fx.Store().CommitAggregate(fx.Ctx(), req.Fence())
	require.NoError(t, err)

	// 24 participants fit (124 ops): prepare and commit move them all
	req = conformance.AggregateRequest("fits", 1, conformance.TargetB, authority.CapacityVector{Actors: 24}, parts[:24]...)
	fence := fx.MustPrepare(req)
	res, err := fx.Store().CommitAggregate(fx.Ctx(), fence)
	require.NoError(t, err)
	require.Equal(t, authority.KindCommitted, res.Kind)
	fx.RequireUsage(conformance.NodeB, authority.ObjectActor, "", 24, 0)
	fx.RequireUsage(conformance.NodeA, authority.ObjectActor, "", 1, 0)
}

// TestAggregateFromManyNodesOverTxnLimit: each node a participant leaves
// costs its commit one more op (the node's capacity epoch): 20 participants
// from 20 nodes fit (5·20 + 3 + 20 = 123 ops), 21 from 21 nodes (129) are
// refused once prepare has read where the rows are, before anything is
// written.
func TestAggregateFromManyNodesOverTxnLimit(t *testing.T) {
	h := etcdFactory(t)
	fx := conformance.NewFixture(t, h)
	parts := make([]authority.AggregateParticipant, 21)
	for i := range parts {
		src := conformance.Target(authority.NodeDescriptor{MeshName: "mesh-1", RID: fmt.Sprintf("src-%02d", i)}, conformance.NodeLifecycle,
			authority.OwnerToken{OwnerID: fmt.Sprintf("src-owner-%02d", i), LeaseGeneration: 1})
		fx.SetLive(src, true)
		id := fmt.Sprintf("spread-%02d", i)
		row := fx.Active(authority.ObjectActor, id, src)
		parts[i] = conformance.Participant(fx.Key(authority.ObjectActor, id), row.StoreVersion, authority.TransitionNewOwner, []byte("moved"))
	}
	before := fx.State()
	req := conformance.AggregateRequest("spread-too-big", 1, conformance.TargetB, authority.CapacityVector{Actors: 21}, parts...)
	_, err := fx.Store().PrepareAggregate(fx.Ctx(), req)
	requireLimit(t, err, "--max-txn-ops")
	fx.RequireState(before)

	req = conformance.AggregateRequest("spread-fits", 1, conformance.TargetB, authority.CapacityVector{Actors: 20}, parts[:20]...)
	fence := fx.MustPrepare(req)
	res, err := fx.Store().CommitAggregate(fx.Ctx(), fence)
	require.NoError(t, err)
	require.Equal(t, authority.KindCommitted, res.Kind)
	fx.RequireUsage(conformance.NodeB, authority.ObjectActor, "", 20, 0)
}

// TestRemoveOwnerRowsOnManyNodes: removing an owner's rows spread over 45
// node lifecycles touches each node's epoch and stays within the Txn limit.
func TestRemoveOwnerRowsOnManyNodes(t *testing.T) {
	h := etcdFactory(t)
	fx := conformance.NewFixture(t, h)
	owner := authority.OwnerToken{OwnerID: "spread-owner", LeaseGeneration: 1}
	for i := range 45 {
		tgt := conformance.Target(authority.NodeDescriptor{MeshName: "mesh-1", RID: fmt.Sprintf("n-%02d", i)}, conformance.NodeLifecycle, owner)
		fx.SetLive(tgt, true)
		fx.Active(authority.ObjectUserSpot, fmt.Sprintf("spot-%02d", i), tgt)
	}
	n, err := fx.Store().RemoveAllByOwner(fx.Ctx(), owner)
	require.NoError(t, err)
	require.EqualValues(t, 45, n)
	require.Empty(t, fx.ListAll("", 100))
}

func TestServerTxnLimitErrorIsTyped(t *testing.T) {
	etcdtest.SkipIfExternal(t, externalLimits)
	// the store believes the server allows 1000 ops; the server allows 128
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, nil, etcdstore.Config{Clock: clock, MaxTxnOps: 1000})
	h := harnessFor(s, clock)
	fx := conformance.NewFixture(t, h)
	// prepare fits (≈ 50 compares), commit does not: 3·45 + 5 = 140 ops with
	// placement keys (storeversion.FewerKeys: each row, its placement key
	// deleted and put; the record, the aggregate's capacity entry, two
	// epochs and the target's owner directory key)
	parts := activeRows(fx, 45)
	req := conformance.AggregateRequest("server-refuses", 1, conformance.TargetB, authority.CapacityVector{Actors: 45}, parts...)
	fence := fx.MustPrepare(req)
	before := fx.State()
	_, err := s.CommitAggregate(fx.Ctx(), fence)
	requireLimit(t, err, "--max-txn-ops")
	fx.RequireState(before)
}

func bigReserve(fx *conformance.Fixture, id string, refBytes int) authority.ReserveRequest {
	req := fx.ReserveRequest(authority.ObjectActor, id, conformance.TargetA)
	req.CreatingPayload = bytes.Repeat([]byte("p"), authority.MaxPayloadBytes)
	req.Intent.RequestContentReference = strings.Repeat("r", refBytes)
	return req
}

func TestTooLargeRequestIsRefusedBeforeSending(t *testing.T) {
	h := etcdFactory(t)
	fx := conformance.NewFixture(t, h)
	before := fx.State()
	_, err := fx.Store().Reserve(fx.Ctx(), bigReserve(fx, "huge", 600*1024))
	requireLimit(t, err, "--max-request-bytes")
	fx.RequireState(before)
	// a 1 MiB payload alone fits
	fx.MustReserve(bigReserve(fx, "large", 10))
}

func TestServerRequestSizeErrorIsTyped(t *testing.T) {
	etcdtest.SkipIfExternal(t, externalLimits)
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, nil, etcdstore.Config{Clock: clock, MaxRequestBytes: 3 * 1024 * 1024})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	before := fx.State()
	_, err := s.Reserve(context.Background(), bigReserve(fx, "huge", 600*1024))
	requireLimit(t, err, "--max-request-bytes")
	fx.RequireState(before)
}

func TestUnavailableServerErrorIsTyped(t *testing.T) {
	_, err := etcdstore.New(context.Background(), etcdstore.Config{Endpoints: []string{"127.0.0.1:1"}, DialTimeout: 200e6, RequestTimeout: 500e6})
	require.Error(t, err)
	require.True(t, errors.Is(err, authority.ErrUnavailable), "got %v", err)
}

func TestNamespaceMustEndInSlash(t *testing.T) {
	_, err := etcdstore.New(context.Background(), etcdstore.Config{Client: shared, Namespace: "/no-slash"})
	require.ErrorIs(t, err, authority.ErrInvalidArgument)
}
