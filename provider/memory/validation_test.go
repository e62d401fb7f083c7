package memory

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
)

// TestInvalidInputWritesNothing runs every operation with bad input on a
// populated store: each returns ErrInvalidArgument and leaves it unchanged.
func TestInvalidInputWritesNothing(t *testing.T) {
	e := newEnv(t)
	key, ready := e.spot("s1")
	rr := e.reserve(actorRequest("a1", target(nodeA, ownerA)))
	actor := actorRequest("a1", target(nodeA, ownerA))
	big := make([]byte, authority.MaxPayloadBytes+1)
	good := completion(authority.TerminalCreated, operation(1), testEpoch.Add(time.Minute))
	complete := func(mutate func(*authority.CompleteCreationRequest)) func() error {
		return func() error {
			req := authority.CompleteCreationRequest{
				Key: actor.Key, ReservationID: rr.ReservationID, ExpectedStoreVersion: rr.Creating.StoreVersion,
				Target: actor.Target, Completion: good,
			}
			pub := *good.Terminal
			req.Completion.Terminal = &pub
			mutate(&req)
			_, err := e.s.CompleteCreation(e.ctx, req)
			return err
		}
	}
	aggregate := func(mutate func(*authority.AggregatePrepareRequest)) func() error {
		return func() error {
			req := moveRequest(1, map[authority.Key]*authority.Snapshot{key: ready}, nil)
			mutate(&req)
			_, err := e.s.PrepareAggregate(e.ctx, req)
			return err
		}
	}
	reserve := func(mutate func(*authority.ReserveRequest)) func() error {
		return func() error {
			req := spotRequest("s9", target(nodeA, ownerA))
			mutate(&req)
			_, err := e.s.Reserve(e.ctx, req)
			return err
		}
	}
	cases := map[string]func() error{
		"read empty key": func() error { _, err := e.s.ReadAuthority(e.ctx, ""); return err },
		"cas big payload": func() error {
			_, err := e.s.CompareExchangeAuthority(e.ctx, key, ready.StoreVersion, authority.Put(big))
			return err
		},
		"cas new owner": func() error {
			m := authority.Put(nil)
			m.GenerationTransition = authority.TransitionNewOwner
			_, err := e.s.CompareExchangeAuthority(e.ctx, key, ready.StoreVersion, m)
			return err
		},
		"cas bad rebind": func() error {
			_, err := e.s.CompareExchangeAuthority(e.ctx, key, ready.StoreVersion, authority.RebindOwnerLease(ownerA, ownerB, nil))
			return err
		},
		"cas bad kind": func() error {
			_, err := e.s.CompareExchangeAuthority(e.ctx, key, ready.StoreVersion, authority.Mutation{Kind: "bogus"})
			return err
		},
		"list limit 0":     func() error { _, err := e.s.ListAuthorities(e.ctx, "", "", 0); return err },
		"list limit 1001":  func() error { _, err := e.s.ListAuthorities(e.ctx, "", "", 1001); return err },
		"list bad cursor":  func() error { _, err := e.s.ListAuthorities(e.ctx, "", "garbage", 10); return err },
		"remove no owner":  func() error { _, err := e.s.RemoveAllByOwner(e.ctx, authority.OwnerToken{}); return err },
		"reserve empty id": reserve(func(r *authority.ReserveRequest) { r.Key.GlobalID = "" }),
		"reserve nul type": reserve(func(r *authority.ReserveRequest) { r.Intent.StableType = "a\x00" }),
		"reserve no ref":   reserve(func(r *authority.ReserveRequest) { r.Intent.RequestContentReference = "" }),
		"reserve big":      reserve(func(r *authority.ReserveRequest) { r.CreatingPayload = big }),
		"reserve zero cap": reserve(func(r *authority.ReserveRequest) { r.Capacity = authority.CapacityVector{} }),
		"reserve sha":      reserve(func(r *authority.ReserveRequest) { r.Intent.RequestSHA256 = []byte{1} }),
		"reserve size":     reserve(func(r *authority.ReserveRequest) { r.Intent.RequestEncodedSize = -1 }),
		"commit actor": func() error {
			_, err := e.s.Commit(e.ctx, authority.CommitRequest{Key: actor.Key, ReservationID: rr.ReservationID})
			return err
		},
		"commit big": func() error {
			_, err := e.s.Commit(e.ctx, authority.CommitRequest{Key: authority.ObjectKey{Kind: authority.ObjectUserSpot, GlobalID: "x"}, ReadyPayload: big})
			return err
		},
		"abort bad key": func() error {
			_, err := e.s.Abort(e.ctx, authority.AbortRequest{Key: authority.ObjectKey{Kind: "BAD", GlobalID: "x"}})
			return err
		},
		"complete spot":   complete(func(r *authority.CompleteCreationRequest) { r.Key.Kind = authority.ObjectUserSpot }),
		"complete kind":   complete(func(r *authority.CompleteCreationRequest) { r.Completion.Kind = "bogus" }),
		"complete no pub": complete(func(r *authority.CompleteCreationRequest) { r.Completion.Terminal = nil }),
		"complete sha":    complete(func(r *authority.CompleteCreationRequest) { r.Completion.Terminal.TerminalEnvelopeSHA256 = digest("x") }),
		"complete expired": complete(func(r *authority.CompleteCreationRequest) {
			r.Completion.Terminal.OperationDeadline = testEpoch.Add(-time.Hour)
		}),
		"complete op":        complete(func(r *authority.CompleteCreationRequest) { r.Completion.Terminal.Operation.SourceNodeGeneration = 0 }),
		"complete no res id": complete(func(r *authority.CompleteCreationRequest) { r.ReservationID = "" }),
		"terminal bad op": func() error {
			_, err := e.s.ReadCreationTerminal(e.ctx, authority.CreationOperation{})
			return err
		},
		"prepare no id":     aggregate(func(r *authority.AggregatePrepareRequest) { r.AggregateID = "" }),
		"prepare digest":    aggregate(func(r *authority.AggregatePrepareRequest) { r.InventoryDigest = nil }),
		"prepare unsorted":  aggregate(func(r *authority.AggregatePrepareRequest) { r.Participants = append(r.Participants, r.Participants[0]) }),
		"prepare zero cap":  aggregate(func(r *authority.AggregatePrepareRequest) { r.Capacity = authority.CapacityVector{} }),
		"commit bad fence":  func() error { _, err := e.s.CommitAggregate(e.ctx, authority.Fence{AggregateID: "a"}); return err },
		"abort bad fence":   func() error { _, err := e.s.AbortAggregate(e.ctx, authority.Fence{AggregateGeneration: 1}); return err },
		"wait on empty key": func() error { return e.s.WaitForChange(e.ctx, "", "") },
	}
	before := e.state()
	for name, run := range cases {
		t.Run(name, func(t *testing.T) {
			require.ErrorIs(t, run(), authority.ErrInvalidArgument)
			require.Equal(t, before, e.state())
		})
	}
}

// TestCancelledContext checks that every operation refuses a done context
// before doing anything.
func TestCancelledContext(t *testing.T) {
	e := newEnv(t)
	key, ready := e.spot("s1")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	req := spotRequest("s2", target(nodeA, ownerA))
	actor := actorRequest("a1", target(nodeA, ownerA))
	calls := map[string]func() error{
		"read": func() error { _, err := e.s.ReadAuthority(ctx, key); return err },
		"cas": func() error {
			_, err := e.s.CompareExchangeAuthority(ctx, key, ready.StoreVersion, authority.Delete())
			return err
		},
		"list":    func() error { _, err := e.s.ListAuthorities(ctx, "", "", 10); return err },
		"remove":  func() error { _, err := e.s.RemoveAllByOwner(ctx, ownerA); return err },
		"reserve": func() error { _, err := e.s.Reserve(ctx, req); return err },
		"commit":  func() error { _, err := e.s.Commit(ctx, authority.CommitRequest{Key: req.Key}); return err },
		"complete": func() error {
			_, err := e.s.CompleteCreation(ctx, authority.CompleteCreationRequest{Key: actor.Key, ReservationID: "r", Completion: completion(authority.TerminalFailed, operation(1), testEpoch.Add(time.Minute))})
			return err
		},
		"terminal": func() error { _, err := e.s.ReadCreationTerminal(ctx, operation(1)); return err },
		"abort":    func() error { _, err := e.s.Abort(ctx, authority.AbortRequest{Key: req.Key}); return err },
		"prepare": func() error {
			_, err := e.s.PrepareAggregate(ctx, moveRequest(1, map[authority.Key]*authority.Snapshot{key: ready}, nil))
			return err
		},
		"commitAggregate": func() error {
			_, err := e.s.CommitAggregate(ctx, authority.Fence{AggregateID: "a", AggregateGeneration: 1})
			return err
		},
		"abortAggregate": func() error {
			_, err := e.s.AbortAggregate(ctx, authority.Fence{AggregateID: "a", AggregateGeneration: 1})
			return err
		},
		"usage": func() error { _, err := e.s.CapacityUsage(ctx, nodeA, 1, authority.ObjectActor, ""); return err },
		"wait":  func() error { return e.s.WaitForChange(ctx, key, ready.StoreVersion) },
	}
	before := e.state()
	for name, call := range calls {
		require.ErrorIs(t, call(), context.Canceled, name)
	}
	require.Equal(t, before, e.state())
}

func TestGenerationExhausted(t *testing.T) {
	max := authority.MaxGeneration
	t.Run("reserve", func(t *testing.T) {
		for _, counter := range []string{"store", "object", "owner"} {
			e := newEnv(t)
			e.s.mu.Lock()
			switch counter {
			case "store":
				e.s.storeVersion = max
			case "object":
				e.s.objectGeneration = max
			case "owner":
				e.s.ownerGeneration = max
			}
			e.s.mu.Unlock()
			before := e.state()
			require.Equal(t, authority.KindGenerationExhausted, e.reserve(spotRequest("s1", target(nodeA, ownerA))).Kind, counter)
			require.Equal(t, before, e.state())
		}
	})
	t.Run("one left", func(t *testing.T) {
		e := newEnv(t)
		e.s.storeVersion = max - 1
		req := spotRequest("s1", target(nodeA, ownerA))
		res := e.reserve(req)
		require.Equal(t, authority.KindReserved, res.Kind)
		require.Equal(t, authority.StoreVersion("9223372036854775807"), res.Creating.StoreVersion)
		require.Equal(t, authority.KindGenerationExhausted, e.commit(commitRequest(req, res, "r")).Kind)
		out, err := e.s.CompleteCreation(e.ctx, authority.CompleteCreationRequest{
			Key: authority.ObjectKey{Kind: authority.ObjectActor, GlobalID: "a"}, ReservationID: "x",
			Completion: completion(authority.TerminalFailed, operation(1), testEpoch.Add(time.Minute)),
		})
		require.NoError(t, err)
		require.Equal(t, authority.KindStale, out.Kind)
	})
	t.Run("cas and completion", func(t *testing.T) {
		e := newEnv(t)
		key, ready := e.spot("s1")
		areq := actorRequest("a1", target(nodeA, ownerA))
		ares := e.reserve(areq)
		e.s.storeVersion = max
		before := e.state()
		for _, m := range []authority.Mutation{authority.Put(nil), authority.Delete(), authority.Restore(ownerA, nil)} {
			require.Equal(t, authority.KindGenerationExhausted, e.cas(key, ready.StoreVersion, m).Kind)
		}
		out, err := e.s.CompleteCreation(e.ctx, authority.CompleteCreationRequest{
			Key: areq.Key, ReservationID: ares.ReservationID, ExpectedStoreVersion: ares.Creating.StoreVersion,
			Target: areq.Target, Completion: completion(authority.TerminalCreated, operation(1), testEpoch.Add(time.Minute)),
		})
		require.NoError(t, err)
		require.Equal(t, authority.KindGenerationExhausted, out.Kind)
		require.Equal(t, before, e.state())
	})
	t.Run("aggregate", func(t *testing.T) {
		e := newEnv(t)
		k1, s1 := e.spot("s1")
		k2, s2 := e.spot("s2")
		req := moveRequest(1, map[authority.Key]*authority.Snapshot{k1: s1, k2: s2}, nil)
		require.Equal(t, authority.KindPrepared, e.prepare(req))
		e.s.storeVersion = max - 1 // two participants need two versions
		require.Equal(t, authority.KindGenerationExhausted, e.commitAggregate(req.Fence()))
		e.s.storeVersion = 10
		e.s.ownerGeneration = max - 1 // two owner transitions need two
		require.Equal(t, authority.KindGenerationExhausted, e.commitAggregate(req.Fence()))
		e.s.ownerGeneration = max - 2
		require.Equal(t, authority.KindCommitted, e.commitAggregate(req.Fence()))
		require.Equal(t, max, e.read(k2).Snapshot.AuthorityOwnerGeneration)
	})
}
