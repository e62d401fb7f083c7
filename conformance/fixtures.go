package conformance

import (
	"context"
	"crypto/sha256"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
)

// The nodes and owners fixtures place objects on. Fixture marks TargetA and
// TargetB live when it is made.
var (
	// NodeA is the default node of a fixture.
	NodeA = authority.NodeDescriptor{MeshName: "mesh-1", RID: "node-a"}
	// NodeB is the second node, the usual aggregate target.
	NodeB = authority.NodeDescriptor{MeshName: "mesh-1", RID: "node-b"}
	// OwnerA owns the rows placed on NodeA.
	OwnerA = authority.OwnerToken{OwnerID: "owner-a", LeaseGeneration: 1}
	// OwnerB owns the rows placed on NodeB.
	OwnerB = authority.OwnerToken{OwnerID: "owner-b", LeaseGeneration: 1}
)

// DefaultStableType is the stable type of the objects a fixture reserves.
const DefaultStableType = "type-a"

// NodeLifecycle is the lifecycle generation of NodeA and NodeB in TargetA
// and TargetB.
const NodeLifecycle int64 = 1

// TargetA is OwnerA on NodeA.
var TargetA = Target(NodeA, NodeLifecycle, OwnerA)

// TargetB is OwnerB on NodeB.
var TargetB = Target(NodeB, NodeLifecycle, OwnerB)

// Target builds a creation target.
func Target(node authority.NodeDescriptor, lifecycleGeneration int64, owner authority.OwnerToken) authority.CreationTarget {
	return authority.CreationTarget{
		MeshName:                node.MeshName,
		NodeRID:                 node.RID,
		NodeLifecycleGeneration: lifecycleGeneration,
		Owner:                   owner,
	}
}

// CapacityPolicyFunc adapts a function to authority.CapacityPolicy.
type CapacityPolicyFunc func(node authority.NodeDescriptor, requested, currentReserved, currentActive authority.CapacityVector) bool

// PlacementCapacityAvailable calls fn.
func (fn CapacityPolicyFunc) PlacementCapacityAvailable(node authority.NodeDescriptor, requested, currentReserved, currentActive authority.CapacityVector) bool {
	return fn(node, requested, currentReserved, currentActive)
}

// ActorLimit is a capacity policy allowing at most limit actors (reserved
// plus active) per node; other counters are unbounded.
func ActorLimit(limit int64) authority.CapacityPolicy {
	return CapacityPolicyFunc(func(_ authority.NodeDescriptor, requested, reserved, active authority.CapacityVector) bool {
		return reserved.Actors+active.Actors+requested.Actors <= limit
	})
}

// Fixture builds valid requests against one harness and checks their
// effects. Each fixture hands out fresh operation IDs and payloads.
type Fixture struct {
	T testing.TB
	H *Harness

	ctx context.Context

	seq uint64
}

// NewFixture returns a fixture over h whose operations run on t.Context(),
// and marks TargetA and TargetB live.
func NewFixture(t testing.TB, h *Harness) *Fixture {
	t.Helper()
	return NewFixtureContext(t.Context(), t, h)
}

// NewFixtureContext returns a fixture over h whose operations run on a
// context carrying ctx's values and deadline that also ends when t ends (its
// cleanup), and marks TargetA and TargetB live.
func NewFixtureContext(ctx context.Context, t testing.TB, h *Harness) *Fixture {
	t.Helper()
	require.NotNil(t, h, "factory returned no harness")
	require.NotNil(t, h.Store, "harness has no store")
	require.NotNil(t, h.SetLive, "harness has no SetLive")
	require.NotNil(t, h.Now, "harness has no Now")
	ctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	f := &Fixture{T: t, H: h, ctx: ctx}
	f.SetLive(TargetA, true)
	f.SetLive(TargetB, true)
	return f
}

// Store returns the store under test.
func (f *Fixture) Store() authority.Store { return f.H.Store }

// Ctx returns the context operations run with (see NewFixtureContext).
func (f *Fixture) Ctx() context.Context { return f.ctx }

// SetLive marks the owner of target live or dead on the target's node.
func (f *Fixture) SetLive(target authority.CreationTarget, live bool) {
	f.T.Helper()
	f.H.SetLive(f.T, target.Descriptor(), target.NodeLifecycleGeneration, target.Owner, live)
}

// Next returns a number unique within the fixture.
func (f *Fixture) Next() uint64 {
	f.seq++
	return f.seq
}

// Key encodes an object key, failing the test on error.
func (f *Fixture) Key(kind authority.ObjectKind, globalID string) authority.Key {
	f.T.Helper()
	k, err := authority.EncodeKey(kind, globalID)
	require.NoError(f.T, err)
	return k
}

// Capacity returns the capacity a fixture object of kind consumes: one actor
// for ObjectActor, one Spot and one of its type for a Spot kind, one Spot
// otherwise.
func Capacity(kind authority.ObjectKind, stableType string) authority.CapacityVector {
	switch {
	case kind == authority.ObjectActor:
		return authority.CapacityVector{Actors: 1}
	case kind.IsSpot():
		return authority.CapacityVector{Spots: 1, SpotType: &authority.SpotTypeCapacity{ObjectKind: kind, StableType: stableType, Count: 1}}
	default:
		return authority.CapacityVector{Spots: 1}
	}
}

// ReserveRequest returns a valid reserve request for kind/globalID on target.
func (f *Fixture) ReserveRequest(kind authority.ObjectKind, globalID string, target authority.CreationTarget) authority.ReserveRequest {
	n := f.Next()
	ref := fmt.Sprintf("content-%d", n)
	sum := sha256.Sum256([]byte(ref))
	return authority.ReserveRequest{
		Key: authority.ObjectKey{Kind: kind, GlobalID: globalID},
		Intent: authority.CreationIntent{
			StableType:              DefaultStableType,
			RequestContentReference: ref,
			RequestSHA256:           sum[:],
			RequestEncodedSize:      int64(len(ref)),
		},
		Target:          target,
		CreatingPayload: []byte(fmt.Sprintf("creating-%d", n)),
		Capacity:        Capacity(kind, DefaultStableType),
	}
}

// Reservation is a successful reservation: its request and result.
type Reservation struct {
	Req authority.ReserveRequest
	Res authority.ReserveResult
	Key authority.Key
}

// MustReserve reserves req and requires KindReserved.
func (f *Fixture) MustReserve(req authority.ReserveRequest) Reservation {
	f.T.Helper()
	res, err := f.Store().Reserve(f.Ctx(), req)
	require.NoError(f.T, err)
	require.Equal(f.T, authority.KindReserved, res.Kind, "reserve %v: current %+v", req.Key, res.Current)
	require.NotNil(f.T, res.Creating)
	key, err := req.Key.Encode()
	require.NoError(f.T, err)
	return Reservation{Req: req, Res: res, Key: key}
}

// Reserve reserves kind/globalID on target and requires KindReserved.
func (f *Fixture) Reserve(kind authority.ObjectKind, globalID string, target authority.CreationTarget) Reservation {
	f.T.Helper()
	return f.MustReserve(f.ReserveRequest(kind, globalID, target))
}

// CommitRequest returns the commit request of r.
func (r Reservation) CommitRequest(ready []byte) authority.CommitRequest {
	return authority.CommitRequest{
		Key:                  r.Req.Key,
		ReservationID:        r.Res.ReservationID,
		ExpectedStoreVersion: r.Res.Creating.StoreVersion,
		Target:               r.Req.Target,
		ReadyPayload:         ready,
	}
}

// AbortRequest returns the abort request of r.
func (r Reservation) AbortRequest() authority.AbortRequest {
	return authority.AbortRequest{
		Key:                  r.Req.Key,
		ReservationID:        r.Res.ReservationID,
		ExpectedStoreVersion: r.Res.Creating.StoreVersion,
		Target:               r.Req.Target,
	}
}

// CompleteRequest returns the completeCreation request of r with completion
// kind, ready payload (created only) and terminal publication pub.
func (r Reservation) CompleteRequest(kind authority.CompletionKind, ready []byte, pub *authority.TerminalPublication) authority.CompleteCreationRequest {
	c := authority.Completion{Kind: kind, Terminal: pub}
	if kind == authority.TerminalCreated {
		c.ReadyPayload = ready
	}
	return authority.CompleteCreationRequest{
		Key:                  r.Req.Key,
		ReservationID:        r.Res.ReservationID,
		ExpectedStoreVersion: r.Res.Creating.StoreVersion,
		Target:               r.Req.Target,
		Completion:           c,
	}
}

// Operation returns a fresh creation operation identity.
func (f *Fixture) Operation() authority.CreationOperation {
	return authority.CreationOperation{
		SourceNodeRID:        "source-node",
		SourceNodeGeneration: 1,
		OperationID:          authority.CreationOperationID{High: 0xc0ffee, Low: f.Next()},
	}
}

// Publication returns a valid terminal publication of a fresh operation whose
// deadline is one minute after the store's clock.
func (f *Fixture) Publication() *authority.TerminalPublication {
	return f.PublicationFor(f.Operation(), time.Minute)
}

// PublicationFor returns a valid terminal publication of op whose deadline is
// the store's clock plus untilDeadline, truncated to a millisecond.
func (f *Fixture) PublicationFor(op authority.CreationOperation, untilDeadline time.Duration) *authority.TerminalPublication {
	env := []byte(fmt.Sprintf("terminal-envelope-%d", f.Next()))
	sum := sha256.Sum256(env)
	return &authority.TerminalPublication{
		Operation:              op,
		TerminalEnvelope:       env,
		TerminalEnvelopeSHA256: sum[:],
		OperationDeadline:      f.H.Now().Add(untilDeadline).Truncate(time.Millisecond),
	}
}

// MustCommit commits r and requires KindCommitted.
func (f *Fixture) MustCommit(r Reservation, ready []byte) *authority.Snapshot {
	f.T.Helper()
	res, err := f.Store().Commit(f.Ctx(), r.CommitRequest(ready))
	require.NoError(f.T, err)
	require.Equal(f.T, authority.KindCommitted, res.Kind)
	require.NotNil(f.T, res.Ready)
	return res.Ready
}

// MustComplete completes r and requires the completion kind as result.
func (f *Fixture) MustComplete(r Reservation, kind authority.CompletionKind, ready []byte, pub *authority.TerminalPublication) authority.CompleteCreationResult {
	f.T.Helper()
	res, err := f.Store().CompleteCreation(f.Ctx(), r.CompleteRequest(kind, ready, pub))
	require.NoError(f.T, err)
	require.Equal(f.T, authority.ResultKind(kind), res.Kind)
	require.NotNil(f.T, res.Terminal)
	return res
}

// Active creates an active object of kind/globalID on target (reserve then
// commit, or completeCreation for an Actor) and returns its row.
func (f *Fixture) Active(kind authority.ObjectKind, globalID string, target authority.CreationTarget) *authority.Snapshot {
	f.T.Helper()
	r := f.Reserve(kind, globalID, target)
	ready := []byte(fmt.Sprintf("ready-%d", f.Next()))
	if kind == authority.ObjectActor {
		res := f.MustComplete(r, authority.TerminalCreated, ready, f.Publication())
		require.NotNil(f.T, res.Ready)
		return res.Ready
	}
	return f.MustCommit(r, ready)
}

// Read reads the row at key.
func (f *Fixture) Read(key authority.Key) authority.ReadResult {
	f.T.Helper()
	res, err := f.Store().ReadAuthority(f.Ctx(), key)
	require.NoError(f.T, err)
	return res
}

// MustRow reads the row at key and requires it to exist.
func (f *Fixture) MustRow(key authority.Key) *authority.Snapshot {
	f.T.Helper()
	res := f.Read(key)
	require.Equal(f.T, authority.KindSnapshot, res.Kind, "row %s", key)
	require.NotNil(f.T, res.Snapshot)
	return res.Snapshot
}

// RequireMissing requires that there is no row at key.
func (f *Fixture) RequireMissing(key authority.Key) {
	f.T.Helper()
	res := f.Read(key)
	require.Equal(f.T, authority.KindMissing, res.Kind, "row %s: %+v", key, res.Snapshot)
}

// Put rewrites an active row's payload and requires KindStored.
func (f *Fixture) Put(key authority.Key, expected authority.StoreVersion, payload []byte) *authority.Snapshot {
	f.T.Helper()
	res, err := f.Store().CompareExchangeAuthority(f.Ctx(), key, expected, authority.Put(payload))
	require.NoError(f.T, err)
	require.Equal(f.T, authority.KindStored, res.Kind, "put %s: current %+v", key, res.Current)
	return res.Snapshot
}

// Delete deletes an active row at version expected and requires KindDeleted.
func (f *Fixture) Delete(key authority.Key, expected authority.StoreVersion) {
	f.T.Helper()
	res, err := f.Store().CompareExchangeAuthority(f.Ctx(), key, expected, authority.Delete())
	require.NoError(f.T, err)
	require.Equal(f.T, authority.KindDeleted, res.Kind, "delete %s: current %+v", key, res.Current)
}

// Usage returns CapacityUsage of one counter.
func (f *Fixture) Usage(node authority.NodeDescriptor, lifecycleGeneration int64, kind authority.ObjectKind, stableType string) authority.CapacityUsage {
	f.T.Helper()
	u, err := f.Store().CapacityUsage(f.Ctx(), node, lifecycleGeneration, kind, stableType)
	require.NoError(f.T, err)
	return u
}

// ActorUsage returns the actor counter of node at NodeLifecycle.
func (f *Fixture) ActorUsage(node authority.NodeDescriptor) authority.CapacityUsage {
	f.T.Helper()
	return f.Usage(node, NodeLifecycle, authority.ObjectActor, "")
}

// RequireUsage requires one counter of node (at NodeLifecycle) to read
// active and reserved.
func (f *Fixture) RequireUsage(node authority.NodeDescriptor, kind authority.ObjectKind, stableType string, active, reserved int64) {
	f.T.Helper()
	require.Equal(f.T, authority.CapacityUsage{Active: active, Reserved: reserved},
		f.Usage(node, NodeLifecycle, kind, stableType), "capacity of %v %s/%s", node, kind, stableType)
}

// ListAll lists every row under prefix, limit at a time, and requires the
// listing not to expire.
func (f *Fixture) ListAll(prefix string, limit int) []authority.ScanItem {
	f.T.Helper()
	var items []authority.ScanItem
	var cursor authority.ScanCursor
	for pages := 0; ; pages++ {
		require.Less(f.T, pages, 100000, "listing does not end")
		res, err := f.Store().ListAuthorities(f.Ctx(), prefix, cursor, limit)
		require.NoError(f.T, err)
		require.Equal(f.T, authority.KindPage, res.Kind)
		require.LessOrEqual(f.T, len(res.Items), limit)
		items = append(items, res.Items...)
		if res.NextCursor == "" {
			return items
		}
		cursor = res.NextCursor
	}
}

// RowState is what State records of one row.
type RowState struct {
	Version    authority.StoreVersion
	Payload    string
	Allocation authority.AllocationState
	Owner      authority.OwnerToken
}

// State is a full picture of what a fixture can observe of a store: every
// row of the standard kinds and the capacity counters of NodeA and NodeB.
type State struct {
	Rows  map[authority.Key]RowState
	Usage map[string]authority.CapacityUsage
}

// StatePrefixes are the prefixes State lists.
var StatePrefixes = []string{
	authority.KindPrefix(authority.ObjectActor),
	authority.KindPrefix(authority.ObjectUserSpot),
	authority.KindPrefix(authority.ObjectInstanceSpot),
}

// State captures the store's rows and capacity counters.
func (f *Fixture) State() State {
	f.T.Helper()
	s := State{Rows: map[authority.Key]RowState{}, Usage: map[string]authority.CapacityUsage{}}
	for _, p := range StatePrefixes {
		for _, it := range f.ListAll(p, authority.MaxScanLimit) {
			s.Rows[it.Key] = RowState{
				Version:    it.Snapshot.StoreVersion,
				Payload:    string(it.Snapshot.Payload),
				Allocation: it.Snapshot.Allocation.State,
				Owner:      it.Snapshot.Owner(),
			}
		}
	}
	for _, node := range []authority.NodeDescriptor{NodeA, NodeB} {
		for _, c := range []struct {
			kind authority.ObjectKind
			st   string
		}{
			{authority.ObjectActor, ""},
			{authority.CounterSpots, ""},
			{authority.ObjectUserSpot, DefaultStableType},
			{authority.ObjectInstanceSpot, DefaultStableType},
		} {
			s.Usage[fmt.Sprintf("%s/%s/%s/%s", node.MeshName, node.RID, c.kind, c.st)] = f.Usage(node, NodeLifecycle, c.kind, c.st)
		}
	}
	return s
}

// RequireState requires the store to be in state want.
func (f *Fixture) RequireState(want State) {
	f.T.Helper()
	require.Equal(f.T, want, f.State(), "store changed")
}

// Participant builds an aggregate participant.
func Participant(key authority.Key, expected authority.StoreVersion, transition authority.GenerationTransition, payload []byte) authority.AggregateParticipant {
	return authority.AggregateParticipant{
		AuthorityKey:         key,
		ExpectedStoreVersion: expected,
		OwnerTransition:      transition,
		AuthorityPayload:     payload,
		MembershipMutation:   []byte("membership:" + string(key)),
	}
}

// AggregateRequest builds a prepare request moving the newOwner participants
// to target, with capacity as the aggregate's capacity. It sorts parts.
func AggregateRequest(id string, generation int64, target authority.CreationTarget, capacity authority.CapacityVector, parts ...authority.AggregateParticipant) authority.AggregatePrepareRequest {
	parts = slices.Clone(parts)
	slices.SortFunc(parts, func(a, b authority.AggregateParticipant) int {
		return strings.Compare(string(a.AuthorityKey), string(b.AuthorityKey))
	})
	digest := sha256.Sum256([]byte(id))
	return authority.AggregatePrepareRequest{
		AggregateID:                         id,
		AggregateGeneration:                 generation,
		TargetOwner:                         target.Owner,
		TargetDescriptor:                    target.Descriptor(),
		TargetDescriptorLifecycleGeneration: target.NodeLifecycleGeneration,
		Capacity:                            capacity,
		InventoryDigest:                     digest[:],
		Participants:                        parts,
	}
}

// MustPrepare prepares req and requires KindPrepared.
func (f *Fixture) MustPrepare(req authority.AggregatePrepareRequest) authority.Fence {
	f.T.Helper()
	res, err := f.Store().PrepareAggregate(f.Ctx(), req)
	require.NoError(f.T, err)
	require.Equal(f.T, authority.KindPrepared, res.Kind)
	require.Equal(f.T, req.Fence(), res.Fence)
	return res.Fence
}

// RequireSameRow requires two snapshots to describe the same row state
// (everything but StoreNow).
func RequireSameRow(t testing.TB, want, got *authority.Snapshot) {
	t.Helper()
	require.NotNil(t, want)
	require.NotNil(t, got)
	w, g := want.Clone(), got.Clone()
	w.StoreNow, g.StoreNow = time.Time{}, time.Time{}
	if len(w.Payload) == 0 && len(g.Payload) == 0 {
		w.Payload, g.Payload = nil, nil
	}
	require.Equal(t, w, g)
}

// TargetsElsewhere returns target moved to another node of its mesh and to
// a node of the same RID in another mesh, with the same lifecycle
// generation and owner, each marked live: only the node tells them
// from target.
func (f *Fixture) TargetsElsewhere(target authority.CreationTarget) []authority.CreationTarget {
	f.T.Helper()
	owner, lifecycle := target.Owner, target.NodeLifecycleGeneration
	out := []authority.CreationTarget{
		Target(authority.NodeDescriptor{MeshName: target.MeshName, RID: target.NodeRID + "-elsewhere"}, lifecycle, owner),
		Target(authority.NodeDescriptor{MeshName: target.MeshName + "-elsewhere", RID: target.NodeRID}, lifecycle, owner),
	}
	for _, t := range out {
		f.SetLive(t, true)
	}
	return out
}
