package coordinator_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/coordinator"
)

const instanceType = "svc.Instance"

func instanceTarget(id string) coordinator.ActivationTarget {
	return coordinator.ActivationTarget{TargetSpotID: id, StableType: instanceType, TargetNodeRID: "node-a", TargetNodeGeneration: 1}
}

func activation(id string) coordinator.Activation {
	return coordinator.Activation{Target: instanceTarget(id), Deadline: time.Now().Add(10 * time.Second), Request: []byte("activate " + id)}
}

type instanceEnv struct {
	*env
	blobs *trackedBlobs
	store authority.Store
}

func newInstanceEnv(t *testing.T, f Factory) *instanceEnv {
	e := newEnv(t, f)
	if e.h.Relocation == nil {
		t.Skip("provider has no relocation store")
	}
	return &instanceEnv{env: e, blobs: trackBlobs(e.h.Relocation), store: e.h.Store}
}

func (e *instanceEnv) authority(t *testing.T, configure ...func(*coordinator.InstanceOptions)) *coordinator.InstanceActivationAuthority {
	t.Helper()
	opts := coordinator.InstanceOptions{
		Store: e.store, Reader: e.h.Reader, Relocation: e.blobs, MeshName: "mesh",
		Owner: func() (authority.OwnerToken, bool) { return ownerA, true },
	}
	for _, c := range configure {
		c(&opts)
	}
	a, err := coordinator.NewInstanceActivationAuthority(opts)
	require.NoError(t, err)
	return a
}

func (e *instanceEnv) blobFound(t *testing.T, ref string) bool {
	t.Helper()
	r, err := e.h.Relocation.Read(e.ctx, authority.BlobReference(ref))
	require.NoError(t, err)
	return r.Kind == authority.KindFound
}

func (e *instanceEnv) instancePayload(t *testing.T, id string) (*authority.Snapshot, coordinator.Payload) {
	t.Helper()
	r := e.read(authority.ObjectInstanceSpot, id)
	require.Equal(t, authority.KindSnapshot, r.Kind)
	p, err := coordinator.DecodeInstancePayload(r.Snapshot.Payload)
	require.NoError(t, err)
	return r.Snapshot, p
}

func spotOf(target coordinator.ActivationTarget, r coordinator.ActivationReservation) coordinator.ActivatedSpot {
	return coordinator.ActivatedSpot{StableType: target.StableType, SpotID: target.TargetSpotID, Generation: r.Attempt, AuthorityOwnerGeneration: r.AuthorityOwnerGeneration}
}

func testInstanceLifecycle(t *testing.T, f Factory) {
	e := newInstanceEnv(t, f)
	var readied []coordinator.RouteFence
	a := e.authority(t, func(o *coordinator.InstanceOptions) {
		o.OnReady = func(_ coordinator.ActivationTarget, r coordinator.RouteFence) { readied = append(readied, r) }
	})
	target := instanceTarget("inst-1")
	read, err := a.Read(e.ctx, target)
	require.NoError(t, err)
	require.Equal(t, coordinator.ReadMissing, read.Kind)

	act := activation("inst-1")
	out, err := a.Reserve(e.ctx, act)
	require.NoError(t, err)
	require.Equal(t, coordinator.ReserveReserved, out.Kind)
	s, p := e.instancePayload(t, "inst-1")
	require.Equal(t, coordinator.StateColdActivating, p.State)
	require.Equal(t, authority.AllocationReserved, s.Allocation.State)
	ref := s.PendingCreation.RequestContentReference
	require.True(t, e.blobFound(t, ref), "the recovery envelope is stored before the reservation")
	blob, err := e.h.Relocation.Read(e.ctx, authority.BlobReference(ref))
	require.NoError(t, err)
	env, err := coordinator.DecodeRecoveryEnvelope(blob.Bytes)
	require.NoError(t, err)
	require.Equal(t, "mesh", env.TargetMeshName)
	require.Equal(t, target, env.Target)
	require.Equal(t, act.Request, env.Request)

	read, err = a.Read(e.ctx, target)
	require.NoError(t, err)
	require.Equal(t, coordinator.AuthorityRead{Kind: coordinator.ReadCreating, ObjectGeneration: out.Reservation.Attempt, AuthorityOwnerGeneration: out.Reservation.AuthorityOwnerGeneration}, read)

	committed, err := a.Commit(e.ctx, target, out.Reservation, spotOf(target, out.Reservation))
	require.NoError(t, err)
	require.Equal(t, coordinator.CommitCommitted, committed.Kind)
	require.Equal(t, []coordinator.RouteFence{committed.Route}, readied)
	s, p = e.instancePayload(t, "inst-1")
	require.Equal(t, coordinator.StateReady, p.State)
	require.NotNil(t, p.ActivationRecovery)
	require.Equal(t, ref, p.ActivationRecovery.Reference)
	require.Equal(t, int64(1), p.ActivationRecovery.InboxSequence)
	require.Equal(t, int64(0), p.ActivationRecovery.ReplayCursor)
	require.Equal(t, s.StoreVersion, committed.Route.StoreVersion)
	require.True(t, e.blobFound(t, ref), "the blob outlives the commit until Complete")

	read, err = a.Read(e.ctx, target)
	require.NoError(t, err)
	require.Equal(t, coordinator.AuthorityRead{Kind: coordinator.ReadReady, Route: committed.Route}, read)
	elsewhere := target
	elsewhere.TargetNodeRID = "node-b"
	read, err = a.Read(e.ctx, elsewhere)
	require.NoError(t, err)
	require.Equal(t, coordinator.ReadMissing, read.Kind)

	done, err := a.Complete(e.ctx, target, committed.Route)
	require.NoError(t, err)
	s, p = e.instancePayload(t, "inst-1")
	require.Nil(t, p.ActivationRecovery, "the inbox is released")
	require.Equal(t, coordinator.StateReady, p.State)
	require.Equal(t, s.StoreVersion, done.StoreVersion)
	require.NotEqual(t, committed.Route.StoreVersion, done.StoreVersion)
	require.False(t, e.blobFound(t, ref), "Complete deletes the blob")
	require.Equal(t, 0, e.blobs.liveCount())

	// Completing again is a no-op once released; a stale route is refused.
	again, err := a.Complete(e.ctx, target, done)
	require.NoError(t, err)
	require.Equal(t, done, again)
	stale := done
	stale.ObjectGeneration++
	_, err = a.Complete(e.ctx, target, stale)
	requireKind(t, err, coordinator.KindSpotMoving)

	// Reserving a Ready instance answers Ready and leaves no blob.
	out, err = a.Reserve(e.ctx, activation("inst-1"))
	require.NoError(t, err)
	require.Equal(t, coordinator.ReserveReady, out.Kind)
	require.Equal(t, done, out.Route)
	require.Equal(t, 0, e.blobs.liveCount())
}

func testInstanceConcurrentJoin(t *testing.T, f Factory) {
	e := newInstanceEnv(t, f)
	first := e.authority(t)
	var conflicts []string
	second := e.authority(t, func(o *coordinator.InstanceOptions) {
		o.OnClaimConflict = func(_, _ string, reason string) { conflicts = append(conflicts, reason) }
	})
	target := instanceTarget("inst-1")
	out, err := first.Reserve(e.ctx, activation("inst-1"))
	require.NoError(t, err)
	require.Equal(t, coordinator.ReserveReserved, out.Kind)

	joined := make(chan coordinator.ReserveOutcome, 1)
	joinErr := make(chan error, 1)
	go func() {
		o, err := second.Reserve(e.ctx, activation("inst-1"))
		joined <- o
		joinErr <- err
	}()
	// The second activation stored its blob, met the reservation and deleted
	// its orphan blob: it is now waiting for the first to be Ready.
	e.blobs.waitUntil(t, func(puts, deletes int) bool { return puts == 2 && deletes == 1 })
	committed, err := first.Commit(e.ctx, target, out.Reservation, spotOf(target, out.Reservation))
	require.NoError(t, err)
	require.NoError(t, <-joinErr)
	j := <-joined
	require.Equal(t, coordinator.ReserveReady, j.Kind)
	require.Equal(t, committed.Route, j.Route)
	require.Equal(t, []string{"activation_in_progress"}, conflicts)
	require.Equal(t, 1, e.blobs.liveCount(), "only the winner's recovery blob remains")
	_, err = first.Complete(e.ctx, target, committed.Route)
	require.NoError(t, err)
	require.Equal(t, 0, e.blobs.liveCount())
}

func testInstanceJoinDeadline(t *testing.T, f Factory) {
	e := newInstanceEnv(t, f)
	first := e.authority(t)
	out, err := first.Reserve(e.ctx, activation("inst-1"))
	require.NoError(t, err)
	second := e.authority(t)
	act := activation("inst-1")
	act.Deadline = time.Now().Add(20 * time.Millisecond)
	_, err = second.Reserve(e.ctx, act)
	ce := requireKind(t, err, coordinator.KindDeadlineExceeded)
	require.True(t, ce.Retryable)
	require.Equal(t, 1, e.blobs.liveCount(), "the joiner's blob is deleted")

	// The first activation is aborted while a joiner waits: the joiner
	// learns the activation ended before Ready.
	joinErr := make(chan error, 1)
	go func() {
		_, err := second.Reserve(e.ctx, activation("inst-1"))
		joinErr <- err
	}()
	e.blobs.waitUntil(t, func(puts, deletes int) bool { return puts == 3 && deletes == 2 })
	require.NoError(t, first.Abort(e.ctx, instanceTarget("inst-1"), out.Reservation))
	requireKind(t, <-joinErr, coordinator.KindSpotMoving)
	require.Equal(t, 0, e.blobs.liveCount())
}

func testInstanceResume(t *testing.T, f Factory) {
	e := newInstanceEnv(t, f)
	target := instanceTarget("inst-1")
	before := e.authority(t)
	out, err := before.Reserve(e.ctx, activation("inst-1"))
	require.NoError(t, err)
	// The node restarts: its authority and everything in its memory are gone.
	before = nil
	after := e.authority(t)
	r := e.read(authority.ObjectInstanceSpot, "inst-1")
	pending, ok := coordinator.PendingActivationOf(r.Snapshot)
	require.True(t, ok)
	ref := pending.RequestReference
	require.True(t, e.blobFound(t, ref))

	// A projection that no longer matches the row is refused.
	stale := pending
	stale.StoreVersion = "not-the-version"
	_, err = after.Resume(e.ctx, target, stale)
	requireKind(t, err, coordinator.KindSpotGenerationStale)
	_, err = after.Commit(e.ctx, target, out.Reservation, spotOf(target, out.Reservation))
	requireKind(t, err, coordinator.KindSpotGenerationStale) // not held by the new authority yet

	resumed, err := after.Resume(e.ctx, target, pending)
	require.NoError(t, err)
	require.Equal(t, out.Reservation, resumed)
	wrong := spotOf(target, resumed)
	wrong.Generation++
	_, err = after.Commit(e.ctx, target, resumed, wrong)
	requireKind(t, err, coordinator.KindSpotGenerationStale)
	committed, err := after.Commit(e.ctx, target, resumed, spotOf(target, resumed))
	require.NoError(t, err)
	require.Equal(t, coordinator.CommitCommitted, committed.Kind)
	_, p := e.instancePayload(t, "inst-1")
	require.Equal(t, ref, p.ActivationRecovery.Reference)
	_, err = after.Complete(e.ctx, target, committed.Route)
	require.NoError(t, err)
	require.False(t, e.blobFound(t, ref))
	_, ok = coordinator.PendingActivationOf(e.read(authority.ObjectInstanceSpot, "inst-1").Snapshot)
	require.False(t, ok)
	// The committed reservation can no longer be resumed.
	_, err = after.Resume(e.ctx, target, pending)
	requireKind(t, err, coordinator.KindSpotGenerationStale)
}

func testInstanceAbort(t *testing.T, f Factory) {
	e := newInstanceEnv(t, f)
	a := e.authority(t)
	target := instanceTarget("inst-1")
	out, err := a.Reserve(e.ctx, activation("inst-1"))
	require.NoError(t, err)
	ref := e.read(authority.ObjectInstanceSpot, "inst-1").Snapshot.PendingCreation.RequestContentReference
	require.True(t, e.blobFound(t, ref))
	require.NoError(t, a.Abort(e.ctx, target, out.Reservation))
	requireMissing(t, e.env, authority.ObjectInstanceSpot, "inst-1")
	require.False(t, e.blobFound(t, ref), "abort deletes the blob")
	require.Equal(t, authority.CapacityUsage{}, e.usage(nodeA, authority.ObjectInstanceSpot, instanceType))
	// Aborting again, or a reservation never held, does nothing.
	require.NoError(t, a.Abort(e.ctx, target, out.Reservation))
	require.NoError(t, a.Abort(e.ctx, target, coordinator.ActivationReservation{Token: "unknown"}))
	_, err = a.Commit(e.ctx, target, out.Reservation, spotOf(target, out.Reservation))
	requireKind(t, err, coordinator.KindSpotGenerationStale)
}

func testInstanceWaitsOutClosing(t *testing.T, f Factory) {
	e := newInstanceEnv(t, f)
	counting := countReserves(e.h.Store)
	e.store = counting
	a := e.authority(t)
	target := instanceTarget("inst-1")
	out, err := a.Reserve(e.ctx, activation("inst-1"))
	require.NoError(t, err)
	committed, err := a.Commit(e.ctx, target, out.Reservation, spotOf(target, out.Reservation))
	require.NoError(t, err)
	done, err := a.Complete(e.ctx, target, committed.Route)
	require.NoError(t, err)

	// The instance starts closing.
	s, p := e.instancePayload(t, "inst-1")
	p.State = coordinator.StateClosing
	closingPayload, err := coordinator.EncodePayload(p)
	require.NoError(t, err)
	key, _ := authority.EncodeKey(authority.ObjectInstanceSpot, "inst-1")
	closing, err := e.h.Store.CompareExchangeAuthority(e.ctx, key, s.StoreVersion, authority.Put(closingPayload))
	require.NoError(t, err)
	require.Equal(t, authority.KindStored, closing.Kind)

	reserved := make(chan coordinator.ReserveOutcome, 1)
	reserveErr := make(chan error, 1)
	go func() {
		o, err := a.Reserve(e.ctx, activation("inst-1"))
		reserved <- o
		reserveErr <- err
	}()
	<-counting.reached(2) // the second Reserve met the Closing row
	deleted, err := e.h.Store.CompareExchangeAuthority(e.ctx, key, closing.Snapshot.StoreVersion, authority.Delete())
	require.NoError(t, err)
	require.Equal(t, authority.KindDeleted, deleted.Kind)
	require.NoError(t, <-reserveErr)
	o := <-reserved
	require.Equal(t, coordinator.ReserveReserved, o.Kind, "once the close released authority, a new activation reserves")
	require.Greater(t, o.Reservation.Attempt, done.ObjectGeneration)
	require.Equal(t, int64(3), counting.reserves.Load())
	require.Equal(t, 1, e.blobs.liveCount())
	require.NoError(t, a.Abort(e.ctx, target, o.Reservation))

	// A close that never releases authority before the deadline.
	out, err = a.Reserve(e.ctx, activation("inst-1"))
	require.NoError(t, err)
	committed, err = a.Commit(e.ctx, target, out.Reservation, spotOf(target, out.Reservation))
	require.NoError(t, err)
	s, p = e.instancePayload(t, "inst-1")
	p.State = coordinator.StateClosing
	closingPayload, _ = coordinator.EncodePayload(p)
	_, err = e.h.Store.CompareExchangeAuthority(e.ctx, key, s.StoreVersion, authority.Put(closingPayload))
	require.NoError(t, err)
	act := activation("inst-1")
	act.Deadline = time.Now().Add(20 * time.Millisecond)
	_, err = a.Reserve(e.ctx, act)
	requireKind(t, err, coordinator.KindDeadlineExceeded)
	require.Equal(t, 1, e.blobs.liveCount(), "only the committed activation's blob remains")
	// Completing a Closing instance is refused (it is not Ready).
	_, err = a.Complete(e.ctx, target, committed.Route)
	requireKind(t, err, coordinator.KindSpotMoving)
}

func testInstanceFailures(t *testing.T, f Factory) {
	e := newInstanceEnv(t, f)
	noOwner := e.authority(t, func(o *coordinator.InstanceOptions) {
		o.Owner = func() (authority.OwnerToken, bool) { return authority.OwnerToken{}, false }
	})
	_, err := noOwner.Reserve(e.ctx, activation("inst-1"))
	requireKind(t, err, coordinator.KindInvalidOperation)
	noBlobs := e.authority(t, func(o *coordinator.InstanceOptions) { o.Relocation = nil })
	_, err = noBlobs.Reserve(e.ctx, activation("inst-1"))
	requireKind(t, err, coordinator.KindInvalidOperation)
	_, err = coordinator.NewInstanceActivationAuthority(coordinator.InstanceOptions{Store: e.h.Store})
	require.ErrorIs(t, err, authority.ErrInvalidArgument)
	_, err = coordinator.NewInstanceActivationAuthority(coordinator.InstanceOptions{MeshName: "mesh"})
	require.ErrorIs(t, err, authority.ErrInvalidArgument)

	a := e.authority(t)
	huge := activation("inst-1")
	huge.Request = make([]byte, authority.MaxPayloadBytes)
	_, err = a.Reserve(e.ctx, huge)
	require.ErrorIs(t, err, authority.ErrInvalidArgument)
	bad := activation("inst-1")
	bad.Deadline = time.Time{}
	_, err = a.Reserve(e.ctx, bad)
	require.ErrorIs(t, err, authority.ErrInvalidArgument)
	require.Equal(t, 0, e.blobs.puts, "invalid input writes nothing")

	// A relocation store that loses what it was given.
	lossy := e.authority(t, func(o *coordinator.InstanceOptions) { o.Relocation = losingBlobs{e.blobs} })
	_, err = lossy.Reserve(e.ctx, activation("inst-1"))
	requireKind(t, err, coordinator.KindIntegrity)
	require.Equal(t, 0, e.blobs.liveCount())
	requireMissing(t, e.env, authority.ObjectInstanceSpot, "inst-1")

	// Capacity exhausted: typed error, blob deleted.
	if e.h.SetCapacityPolicy != nil {
		e.h.SetCapacityPolicy(t, spotLimits{"node-a": 0})
		var reasons atomic.Value
		full := e.authority(t, func(o *coordinator.InstanceOptions) {
			o.OnClaimConflict = func(_, _ string, reason string) { reasons.Store(reason) }
		})
		_, err = full.Reserve(e.ctx, activation("inst-1"))
		requireKind(t, err, coordinator.KindPlacementCapacityExhausted)
		require.Equal(t, string(authority.KindPlacementCapacityExhausted), reasons.Load())
		require.Equal(t, 0, e.blobs.liveCount())
		e.h.SetCapacityPolicy(t, nil)
	}

	// A User Spot of the same ID is not an Instance.
	other := instanceTarget("inst-2")
	other.StableType = "other.Type"
	out, err := a.Reserve(e.ctx, coordinator.Activation{Target: other, Deadline: time.Now().Add(time.Second)})
	require.NoError(t, err)
	_, err = a.Reserve(e.ctx, activation("inst-2"))
	requireKind(t, err, coordinator.KindRequestFailed) // typeMismatch
	require.NoError(t, a.Abort(e.ctx, other, out.Reservation))

	// Dead owner: the reservation fails and the blob is deleted.
	e.h.SetLive(t, nodeA, 1, ownerA, false)
	_, err = a.Reserve(e.ctx, activation("inst-3"))
	requireKind(t, err, coordinator.KindRequestFailed)
	require.Equal(t, 0, e.blobs.liveCount())
	e.h.SetLive(t, nodeA, 1, ownerA, true)

	// Commit after the owner lost its lease: the commit is stale.
	target := instanceTarget("inst-4")
	out, err = a.Reserve(e.ctx, activation("inst-4"))
	require.NoError(t, err)
	e.h.SetLive(t, nodeA, 1, ownerA, false)
	_, err = a.Commit(e.ctx, target, out.Reservation, spotOf(target, out.Reservation))
	requireKind(t, err, coordinator.KindRequestFailed)
	e.h.SetLive(t, nodeA, 1, ownerA, true)

	// Cancelled context: the blob is still cleaned up.
	ctx, cancel := context.WithCancel(e.ctx)
	cancel()
	_, err = a.Reserve(ctx, activation("inst-5"))
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, 1, e.blobs.liveCount(), "only inst-4's blob")
}

// losingBlobs is a relocation store whose reads never find anything.
type losingBlobs struct{ authority.RelocationStore }

func (losingBlobs) Read(context.Context, authority.BlobReference) (authority.BlobReadResult, error) {
	return authority.BlobReadResult{Kind: authority.KindMissing}, nil
}
