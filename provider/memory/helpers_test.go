package memory

import (
	"context"
	"crypto/sha256"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
)

var (
	nodeA  = authority.NodeDescriptor{MeshName: "mesh", RID: "node-a"}
	nodeB  = authority.NodeDescriptor{MeshName: "mesh", RID: "node-b"}
	ownerA = authority.OwnerToken{OwnerID: "owner-a", LeaseGeneration: 1}
	ownerB = authority.OwnerToken{OwnerID: "owner-b", LeaseGeneration: 1}
)

// env is one fresh store with its controls.
type env struct {
	t     *testing.T
	s     *Store
	live  *LiveSet
	clock *authority.ManualClock
	ctx   context.Context
}

func newEnv(t *testing.T, configure ...func(*Config)) *env {
	t.Helper()
	live := NewLiveSet()
	clock := authority.NewManualClock(testEpoch)
	opts := Config{Liveness: live, Clock: clock}
	for _, f := range configure {
		f(&opts)
	}
	live.Set(nodeA, 1, ownerA, true)
	live.Set(nodeB, 1, ownerB, true)
	return &env{t: t, s: New(opts), live: live, clock: clock, ctx: context.Background()}
}

func target(node authority.NodeDescriptor, owner authority.OwnerToken) authority.CreationTarget {
	return authority.CreationTarget{MeshName: node.MeshName, NodeRID: node.RID, NodeLifecycleGeneration: 1, Owner: owner}
}

func digest(s string) []byte {
	d := sha256.Sum256([]byte(s))
	return d[:]
}

func spotRequest(id string, t authority.CreationTarget) authority.ReserveRequest {
	return authority.ReserveRequest{
		Key: authority.ObjectKey{Kind: authority.ObjectUserSpot, GlobalID: id},
		Intent: authority.CreationIntent{
			StableType: "chat", RequestContentReference: "inline-v1:" + id,
			RequestSHA256: digest(id), RequestEncodedSize: 10,
		},
		Target:          t,
		CreatingPayload: []byte("creating:" + id),
		Capacity: authority.CapacityVector{Spots: 1, SpotType: &authority.SpotTypeCapacity{
			ObjectKind: authority.ObjectUserSpot, StableType: "chat", Count: 1,
		}},
	}
}

func actorRequest(id string, t authority.CreationTarget) authority.ReserveRequest {
	return authority.ReserveRequest{
		Key: authority.ObjectKey{Kind: authority.ObjectActor, GlobalID: id},
		Intent: authority.CreationIntent{
			StableType: "counter", RequestContentReference: "inline-v1:" + id,
			RequestSHA256: digest(id), RequestEncodedSize: 10,
		},
		Target:          t,
		CreatingPayload: []byte("creating:" + id),
		Capacity:        authority.CapacityVector{Actors: 1},
	}
}

func mustKey(t *testing.T, k authority.ObjectKey) authority.Key {
	t.Helper()
	key, err := k.Encode()
	require.NoError(t, err)
	return key
}

func (e *env) reserve(req authority.ReserveRequest) authority.ReserveResult {
	e.t.Helper()
	res, err := e.s.Reserve(e.ctx, req)
	require.NoError(e.t, err)
	return res
}

func commitRequest(req authority.ReserveRequest, res authority.ReserveResult, payload string) authority.CommitRequest {
	return authority.CommitRequest{
		Key: req.Key, ReservationID: res.ReservationID, ExpectedStoreVersion: res.Creating.StoreVersion,
		Target: req.Target, ReadyPayload: []byte(payload),
	}
}

func (e *env) commit(req authority.CommitRequest) authority.CommitResult {
	e.t.Helper()
	res, err := e.s.Commit(e.ctx, req)
	require.NoError(e.t, err)
	return res
}

// spot reserves and commits a user Spot on node A, returning its ready row.
func (e *env) spot(id string) (authority.Key, *authority.Snapshot) {
	e.t.Helper()
	req := spotRequest(id, target(nodeA, ownerA))
	res := e.reserve(req)
	require.Equal(e.t, authority.KindReserved, res.Kind)
	c := e.commit(commitRequest(req, res, "ready:"+id))
	require.Equal(e.t, authority.KindCommitted, c.Kind)
	return mustKey(e.t, req.Key), c.Ready
}

func (e *env) read(key authority.Key) authority.ReadResult {
	e.t.Helper()
	res, err := e.s.ReadAuthority(e.ctx, key)
	require.NoError(e.t, err)
	return res
}

func (e *env) usage(node authority.NodeDescriptor, kind authority.ObjectKind, stableType string) authority.CapacityUsage {
	e.t.Helper()
	u, err := e.s.CapacityUsage(e.ctx, node, 1, kind, stableType)
	require.NoError(e.t, err)
	return u
}

func (e *env) cas(key authority.Key, v authority.StoreVersion, m authority.Mutation) authority.CompareExchangeResult {
	e.t.Helper()
	res, err := e.s.CompareExchangeAuthority(e.ctx, key, v, m)
	require.NoError(e.t, err)
	return res
}

func operation(n uint64) authority.CreationOperation {
	return authority.CreationOperation{SourceNodeRID: "source", SourceNodeGeneration: 1, OperationID: authority.CreationOperationID{Low: n}}
}

func completion(kind authority.CompletionKind, op authority.CreationOperation, deadline time.Time) authority.Completion {
	envelope := []byte("terminal:" + string(kind))
	return authority.Completion{
		Kind:         kind,
		ReadyPayload: []byte("ready"),
		Terminal: &authority.TerminalPublication{
			Operation: op, TerminalEnvelope: envelope, TerminalEnvelopeSHA256: digest(string(envelope)),
			OperationDeadline: deadline,
		},
	}
}

// state is a summary of everything the store holds, to check that rejected
// input wrote nothing.
type state struct {
	revision, storeVersion, objectGeneration, ownerGeneration int64
	rows, reservations, terminals, aggregates                 int
	counters                                                  map[authority.CapacityCounter]counterCell
}

func (e *env) state() state {
	e.s.mu.Lock()
	defer e.s.mu.Unlock()
	return state{
		revision: e.s.revision, storeVersion: e.s.storeVersion,
		objectGeneration: e.s.objectGeneration, ownerGeneration: e.s.ownerGeneration,
		rows: e.s.index.Len(), reservations: e.s.reservations.terminals,
		terminals: len(e.s.operationTerminals), aggregates: len(e.s.aggregates),
		counters: cells(e.s.counters),
	}
}

func cells(m map[authority.CapacityCounter]*counterCell) map[authority.CapacityCounter]counterCell {
	c := make(map[authority.CapacityCounter]counterCell, len(m))
	for k, v := range m {
		c[k] = *v
	}
	return c
}

// policyFunc adapts a function to authority.CapacityPolicy.
type policyFunc func(node authority.NodeDescriptor, requested, reserved, active authority.CapacityVector) bool

func (f policyFunc) PlacementCapacityAvailable(node authority.NodeDescriptor, requested, reserved, active authority.CapacityVector) bool {
	return f(node, requested, reserved, active)
}

// maxSpots admits at most n Spots (reserved plus active) per node.
func maxSpots(n int64) authority.CapacityPolicy {
	return policyFunc(func(_ authority.NodeDescriptor, req, reserved, active authority.CapacityVector) bool {
		return reserved.Spots+active.Spots+req.Spots <= n
	})
}

// claims is a fixed authority.IdentityClaims.
type claims map[authority.Key]bool

func (c claims) IdentityClaimed(key authority.Key) bool { return c[key] }
