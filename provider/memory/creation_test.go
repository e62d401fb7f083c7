package memory

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
)

func TestReserveCommit(t *testing.T) {
	e := newEnv(t)
	req := spotRequest("s1", target(nodeA, ownerA))
	key := mustKey(t, req.Key)
	res := e.reserve(req)
	require.Equal(t, authority.KindReserved, res.Kind)
	require.Len(t, res.ReservationID, 36)
	c := res.Creating
	require.Equal(t, res.ReservationID, c.PendingCreation.ReservationID)
	require.Equal(t, req.Intent.RequestSHA256, c.PendingCreation.RequestSHA256)
	require.Equal(t, authority.AllocationReserved, c.Allocation.State)
	require.Equal(t, nodeA, c.Allocation.Descriptor)
	require.Equal(t, ownerA, c.Owner())
	require.Equal(t, []byte("creating:s1"), c.Payload)
	require.Equal(t, testEpoch, c.StoreNow)
	require.Equal(t, authority.CapacityUsage{Reserved: 1}, e.usage(nodeA, authority.ObjectUserSpot, "chat"))
	require.Equal(t, authority.CapacityUsage{Reserved: 1}, e.usage(nodeA, "other", ""))

	// The returned snapshot is the caller's: mutating it changes nothing.
	c.Payload[0] = 'X'
	c.PendingCreation.RequestSHA256[0] ^= 1
	read := e.read(key)
	require.Equal(t, authority.KindSnapshot, read.Kind)
	require.Equal(t, []byte("creating:s1"), read.Snapshot.Payload)
	require.Equal(t, req.Intent.RequestSHA256, read.Snapshot.PendingCreation.RequestSHA256)

	// A second reservation of a reserved key conflicts, showing the row.
	again := e.reserve(req)
	require.Equal(t, authority.KindConflict, again.Kind)
	require.Equal(t, read.Snapshot.StoreVersion, again.Current.Snapshot.StoreVersion)

	creq := commitRequest(req, res, "ready:s1")
	wrongVersion := creq
	wrongVersion.ExpectedStoreVersion = "999"
	require.Equal(t, authority.KindStale, e.commit(wrongVersion).Kind)
	wrongTarget := creq
	wrongTarget.Target.Owner = ownerB
	require.Equal(t, authority.KindStale, e.commit(wrongTarget).Kind)
	wrongID := creq
	wrongID.ReservationID = "other"
	require.Equal(t, authority.KindStale, e.commit(wrongID).Kind)

	done := e.commit(creq)
	require.Equal(t, authority.KindCommitted, done.Kind)
	ready := done.Ready
	require.Nil(t, ready.PendingCreation)
	require.Equal(t, authority.AllocationActive, ready.Allocation.State)
	require.NotEqual(t, c.StoreVersion, ready.StoreVersion)
	require.Equal(t, c.ObjectGeneration, ready.ObjectGeneration)
	require.Equal(t, c.AuthorityOwnerGeneration, ready.AuthorityOwnerGeneration)
	require.Equal(t, []byte("ready:s1"), ready.Payload)
	require.Equal(t, authority.CapacityUsage{Active: 1}, e.usage(nodeA, authority.ObjectUserSpot, "chat"))

	// Re-committing reports the committed row, and changes nothing.
	before := e.state()
	re := e.commit(creq)
	require.Equal(t, authority.KindAlreadyCommitted, re.Kind)
	require.Equal(t, ready.StoreVersion, re.Ready.StoreVersion)
	require.Equal(t, before, e.state())

	// The key now exists; a different type is a mismatch.
	require.Equal(t, authority.KindAlreadyExists, e.reserve(req).Kind)
	other := req
	other.Intent.StableType = "mail"
	mismatch := e.reserve(other)
	require.Equal(t, authority.KindTypeMismatch, mismatch.Kind)
	require.Equal(t, ready.StoreVersion, mismatch.Current.Snapshot.StoreVersion)
}

func TestReserveRefusals(t *testing.T) {
	e := newEnv(t)
	req := spotRequest("s1", target(nodeA, ownerA))
	key := mustKey(t, req.Key)

	dead := spotRequest("s1", target(nodeA, ownerB)) // ownerB is not live on node A
	res := e.reserve(dead)
	require.Equal(t, authority.KindConflict, res.Kind)
	require.Equal(t, authority.KindMissing, res.Current.Kind)

	e.s.SetIdentityClaims(claims{key: true})
	res = e.reserve(req)
	require.Equal(t, authority.KindConflict, res.Kind)
	require.Equal(t, authority.KindMissing, res.Current.Kind)
	e.s.SetIdentityClaims(nil)

	var seen []authority.CapacityVector
	e.s.SetCapacityPolicy(policyFunc(func(node authority.NodeDescriptor, req, reserved, active authority.CapacityVector) bool {
		require.Equal(t, nodeA, node)
		seen = append(seen, reserved, active)
		return reserved.Spots+active.Spots+req.Spots <= 1
	}))
	require.Equal(t, authority.KindReserved, e.reserve(req).Kind)
	require.Equal(t, authority.KindPlacementCapacityExhausted, e.reserve(spotRequest("s2", target(nodeA, ownerA))).Kind)
	require.Equal(t, int64(1), seen[2].Spots)
	require.Equal(t, int64(1), seen[2].SpotType.Count)
	require.Equal(t, int64(0), seen[3].Spots)
	e.s.SetCapacityPolicy(nil)
	require.Equal(t, authority.KindReserved, e.reserve(spotRequest("s2", target(nodeA, ownerA))).Kind)
	require.Equal(t, authority.CapacityUsage{Reserved: 2}, e.usage(nodeA, authority.ObjectUserSpot, "chat"))
}

func TestCommitNeedsLiveTarget(t *testing.T) {
	e := newEnv(t)
	req := spotRequest("s1", target(nodeA, ownerA))
	res := e.reserve(req)
	e.live.Set(nodeA, 1, ownerA, false)
	require.Equal(t, authority.KindStale, e.commit(commitRequest(req, res, "r")).Kind)
	e.live.Set(nodeA, 1, ownerA, true)
	require.Equal(t, authority.KindCommitted, e.commit(commitRequest(req, res, "r")).Kind)
}

func TestAbort(t *testing.T) {
	e := newEnv(t)
	req := spotRequest("s1", target(nodeA, ownerA))
	res := e.reserve(req)
	abort := authority.AbortRequest{Key: req.Key, ReservationID: res.ReservationID, ExpectedStoreVersion: res.Creating.StoreVersion, Target: req.Target}
	bad := abort
	bad.ExpectedStoreVersion = "0"
	out, err := e.s.Abort(e.ctx, bad)
	require.NoError(t, err)
	require.Equal(t, authority.KindStale, out.Kind)

	e.live.Set(nodeA, 1, ownerA, false) // abort needs no live target
	out, err = e.s.Abort(e.ctx, abort)
	require.NoError(t, err)
	require.Equal(t, authority.KindAborted, out.Kind)
	require.Equal(t, authority.KindMissing, e.read(mustKey(t, req.Key)).Kind)
	require.Equal(t, authority.CapacityUsage{}, e.usage(nodeA, authority.ObjectUserSpot, "chat"))

	out, err = e.s.Abort(e.ctx, abort)
	require.NoError(t, err)
	require.Equal(t, authority.KindAlreadyAborted, out.Kind)
	require.Equal(t, authority.KindStale, e.commit(commitRequest(req, res, "r")).Kind)

	// The key can be reserved again, with a new object generation.
	e.live.Set(nodeA, 1, ownerA, true)
	again := e.reserve(req)
	require.Equal(t, authority.KindReserved, again.Kind)
	require.Greater(t, again.Creating.ObjectGeneration, res.Creating.ObjectGeneration)
	require.NotEqual(t, res.ReservationID, again.ReservationID)
}

func TestCompleteCreation(t *testing.T) {
	for _, kind := range []authority.CompletionKind{authority.TerminalCreated, authority.TerminalRejected, authority.TerminalFailed} {
		t.Run(string(kind), func(t *testing.T) {
			e := newEnv(t)
			req := actorRequest("a1", target(nodeA, ownerA))
			key := mustKey(t, req.Key)
			res := e.reserve(req)
			require.Equal(t, authority.KindReserved, res.Kind)
			op := operation(7)
			creq := authority.CompleteCreationRequest{
				Key: req.Key, ReservationID: res.ReservationID, ExpectedStoreVersion: res.Creating.StoreVersion,
				Target: req.Target, Completion: completion(kind, op, testEpoch.Add(time.Minute)),
			}
			stale := creq
			stale.ExpectedStoreVersion = "0"
			out, err := e.s.CompleteCreation(e.ctx, stale)
			require.NoError(t, err)
			require.Equal(t, authority.KindStale, out.Kind)

			out, err = e.s.CompleteCreation(e.ctx, creq)
			require.NoError(t, err)
			require.Equal(t, authority.ResultKind(kind), out.Kind)
			require.Equal(t, kind, out.Terminal.State)
			require.Equal(t, testEpoch.Add(time.Minute+authority.CreationTerminalRetention), out.Terminal.ExpiresAt)
			require.Equal(t, res.ReservationID, out.Terminal.ReservationID)
			usage := e.usage(nodeA, authority.ObjectActor, "")
			if kind == authority.TerminalCreated {
				require.Equal(t, authority.KindSnapshot, e.read(key).Kind)
				require.Equal(t, []byte("ready"), out.Ready.Payload)
				require.Equal(t, authority.CapacityUsage{Active: 1}, usage)
			} else {
				require.Nil(t, out.Ready)
				require.Equal(t, authority.KindMissing, e.read(key).Kind)
				require.Equal(t, authority.CapacityUsage{}, usage)
			}

			// Idempotent: the same request reports the published terminal.
			before := e.state()
			again, err := e.s.CompleteCreation(e.ctx, creq)
			require.NoError(t, err)
			require.Equal(t, authority.KindAlreadyCompleted, again.Kind)
			require.Equal(t, out.Terminal, again.Terminal)
			require.Equal(t, before, e.state())

			found, err := e.s.ReadCreationTerminal(e.ctx, op)
			require.NoError(t, err)
			require.Equal(t, authority.KindFound, found.Kind)
			require.Equal(t, out.Terminal, found.Record)
			found.Record.TerminalEnvelope[0] = 'X'
			found, _ = e.s.ReadCreationTerminal(e.ctx, op)
			require.Equal(t, out.Terminal.TerminalEnvelope, found.Record.TerminalEnvelope)

			missing, err := e.s.ReadCreationTerminal(e.ctx, operation(8))
			require.NoError(t, err)
			require.Equal(t, authority.KindMissing, missing.Kind)

			// After expiry the terminal is gone, and the reservation is only
			// remembered until its retention: the repeat is stale.
			e.clock.Advance(time.Minute + authority.CreationTerminalRetention)
			gone, err := e.s.ReadCreationTerminal(e.ctx, op)
			require.NoError(t, err)
			require.Equal(t, authority.KindMissing, gone.Kind)
			require.Equal(t, e.clock.Now(), gone.StoreNow)
			again, err = e.s.CompleteCreation(e.ctx, withDeadline(creq, e.clock.Now().Add(time.Minute)))
			require.NoError(t, err)
			require.Equal(t, authority.KindStale, again.Kind)
		})
	}
}

func withDeadline(req authority.CompleteCreationRequest, deadline time.Time) authority.CompleteCreationRequest {
	pub := *req.Completion.Terminal
	pub.OperationDeadline = deadline
	req.Completion.Terminal = &pub
	return req
}

func TestCompleteCreationOperationReuse(t *testing.T) {
	e := newEnv(t)
	op := operation(1)
	first := actorRequest("a1", target(nodeA, ownerA))
	r1 := e.reserve(first)
	second := actorRequest("a2", target(nodeA, ownerA))
	r2 := e.reserve(second)
	complete := func(req authority.ReserveRequest, res authority.ReserveResult, kind authority.CompletionKind) authority.CompleteCreationResult {
		out, err := e.s.CompleteCreation(e.ctx, authority.CompleteCreationRequest{
			Key: req.Key, ReservationID: res.ReservationID, ExpectedStoreVersion: res.Creating.StoreVersion,
			Target: req.Target, Completion: completion(kind, op, e.clock.Now().Add(time.Second)),
		})
		require.NoError(t, err)
		return out
	}
	require.Equal(t, authority.KindCreated, complete(first, r1, authority.TerminalCreated).Kind)
	// Another reservation completing the same live operation sees its terminal.
	out := complete(second, r2, authority.TerminalRejected)
	require.Equal(t, authority.KindAlreadyCompleted, out.Kind)
	require.Equal(t, authority.TerminalCreated, out.Terminal.State)
	// Once it expired, the operation identity can publish again.
	e.clock.Advance(time.Second + authority.CreationTerminalRetention)
	require.Equal(t, authority.KindRejected, complete(second, r2, authority.TerminalRejected).Kind)
}

func TestCompleteCreationDeadTarget(t *testing.T) {
	e := newEnv(t)
	req := actorRequest("a1", target(nodeA, ownerA))
	res := e.reserve(req)
	e.live.Set(nodeA, 1, ownerA, false)
	out, err := e.s.CompleteCreation(e.ctx, authority.CompleteCreationRequest{
		Key: req.Key, ReservationID: res.ReservationID, ExpectedStoreVersion: res.Creating.StoreVersion,
		Target: req.Target, Completion: completion(authority.TerminalCreated, operation(1), testEpoch.Add(time.Second)),
	})
	require.NoError(t, err)
	require.Equal(t, authority.KindStale, out.Kind)
	require.Equal(t, 0, e.state().terminals)
}
