package conformance

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
)

// Contention is the number of goroutines of each concurrency test.
const Contention = 32

// RunTestConcurrency checks the store under contention, Orleans-style: many
// goroutines racing for one key see exactly one winner, and retrying
// read-modify-write compare-exchanges lose no update.
func RunTestConcurrency(ctx context.Context, t *testing.T, f Factory) {
	// race runs fn(i) on n goroutines started together and returns once all
	// returned.
	race := func(n int, fn func(i int)) {
		var start, done sync.WaitGroup
		start.Add(1)
		for i := 0; i < n; i++ {
			done.Add(1)
			go func() {
				defer done.Done()
				start.Wait()
				fn(i)
			}()
		}
		start.Done()
		done.Wait()
	}
	type outcome struct {
		kind authority.ResultKind
		err  error
	}
	count := func(t *testing.T, outs []outcome) map[authority.ResultKind]int {
		t.Helper()
		m := map[authority.ResultKind]int{}
		for _, o := range outs {
			require.NoError(t, o.err)
			m[o.kind]++
		}
		return m
	}
	runSubtests(ctx, t, f, []subtest{
		{"ReserveSameKeyOneWinner", func(t *testing.T, fx *Fixture) {
			reqs := make([]authority.ReserveRequest, Contention)
			for i := range reqs {
				reqs[i] = fx.ReserveRequest(authority.ObjectActor, "contended", TargetA)
			}
			outs := make([]outcome, Contention)
			ids := make([]string, Contention)
			race(Contention, func(i int) {
				res, err := fx.Store().Reserve(fx.Ctx(), reqs[i])
				outs[i] = outcome{res.Kind, err}
				ids[i] = res.ReservationID
			})
			kinds := count(t, outs)
			require.Equal(t, map[authority.ResultKind]int{authority.KindReserved: 1, authority.KindConflict: Contention - 1}, kinds)
			row := fx.MustRow(fx.Key(authority.ObjectActor, "contended"))
			for i, o := range outs {
				if o.kind == authority.KindReserved {
					require.Equal(t, ids[i], row.PendingCreation.ReservationID, "the row is the winner's")
					require.Equal(t, reqs[i].CreatingPayload, row.Payload)
				}
			}
			fx.RequireUsage(NodeA, authority.ObjectActor, "", 0, 1)
		}},
		{"ReserveDistinctKeysAllWin", func(t *testing.T, fx *Fixture) {
			reqs := make([]authority.ReserveRequest, Contention)
			for i := range reqs {
				reqs[i] = fx.ReserveRequest(authority.ObjectActor, fmt.Sprintf("k%02d", i), TargetA)
			}
			outs := make([]outcome, Contention)
			versions := make([]authority.StoreVersion, Contention)
			race(Contention, func(i int) {
				res, err := fx.Store().Reserve(fx.Ctx(), reqs[i])
				outs[i] = outcome{res.Kind, err}
				if res.Creating != nil {
					versions[i] = res.Creating.StoreVersion
				}
			})
			require.Equal(t, map[authority.ResultKind]int{authority.KindReserved: Contention}, count(t, outs))
			require.Len(t, fx.ListAll(authority.KindPrefix(authority.ObjectActor), 7), Contention)
			fx.RequireUsage(NodeA, authority.ObjectActor, "", 0, Contention)
			// Versions belong to rows: distinct keys written together (one
			// Txn in etcd) may share one, but each is its row's version.
			for i, v := range versions {
				require.NotEmpty(t, v)
				require.Equal(t, v, fx.MustRow(fx.Key(authority.ObjectActor, fmt.Sprintf("k%02d", i))).StoreVersion, "the reservation's version is its row's")
			}
		}},
		{"CapacityLimitUnderContention", func(t *testing.T, fx *Fixture) {
			needCapacityPolicy(t, fx)
			const limit = 3
			fx.H.SetCapacityPolicy(t, ActorLimit(limit))
			reqs := make([]authority.ReserveRequest, Contention)
			for i := range reqs {
				reqs[i] = fx.ReserveRequest(authority.ObjectActor, fmt.Sprintf("k%02d", i), TargetA)
			}
			outs := make([]outcome, Contention)
			race(Contention, func(i int) {
				res, err := fx.Store().Reserve(fx.Ctx(), reqs[i])
				outs[i] = outcome{res.Kind, err}
			})
			require.Equal(t, map[authority.ResultKind]int{authority.KindReserved: limit, authority.KindPlacementCapacityExhausted: Contention - limit}, count(t, outs))
			fx.RequireUsage(NodeA, authority.ObjectActor, "", 0, limit)
		}},
		{"CompareExchangeIncrements", func(t *testing.T, fx *Fixture) {
			s := fx.Active(authority.ObjectUserSpot, "counter", TargetA)
			key := fx.Key(authority.ObjectUserSpot, "counter")
			fx.Put(key, s.StoreVersion, []byte("0"))
			const n = 16
			errs := make([]error, n)
			race(n, func(i int) {
				for attempt := 0; attempt < 10000; attempt++ {
					cur, err := fx.Store().ReadAuthority(fx.Ctx(), key)
					if err != nil {
						errs[i] = err
						return
					}
					v, err := strconv.Atoi(string(cur.Snapshot.Payload))
					if err != nil {
						errs[i] = err
						return
					}
					res, err := fx.Store().CompareExchangeAuthority(fx.Ctx(), key, cur.Snapshot.StoreVersion, authority.Put([]byte(strconv.Itoa(v+1))))
					if err != nil {
						errs[i] = err
						return
					}
					switch res.Kind {
					case authority.KindStored:
						return
					case authority.KindConflict:
						continue
					default:
						errs[i] = fmt.Errorf("compare-exchange: %s", res.Kind)
						return
					}
				}
				errs[i] = fmt.Errorf("goroutine %d: no success after 10000 attempts", i)
			})
			for _, err := range errs {
				require.NoError(t, err)
			}
			require.Equal(t, strconv.Itoa(n), string(fx.MustRow(key).Payload), "every increment landed exactly once")
		}},
		{"CommitRacesAbort", func(t *testing.T, fx *Fixture) {
			for round := 0; round < 4; round++ {
				r := fx.Reserve(authority.ObjectUserSpot, fmt.Sprintf("s%d", round), TargetA)
				outs := make([]outcome, 2)
				race(2, func(i int) {
					if i == 0 {
						res, err := fx.Store().Commit(fx.Ctx(), r.CommitRequest([]byte("ready")))
						outs[i] = outcome{res.Kind, err}
						return
					}
					res, err := fx.Store().Abort(fx.Ctx(), r.AbortRequest())
					outs[i] = outcome{res.Kind, err}
				})
				count(t, outs)
				committed := outs[0].kind == authority.KindCommitted
				aborted := outs[1].kind == authority.KindAborted
				require.True(t, committed != aborted, "exactly one of commit and abort wins: %+v", outs)
				if committed {
					require.Equal(t, authority.KindStale, outs[1].kind)
					require.Equal(t, authority.AllocationActive, fx.MustRow(r.Key).Allocation.State)
				} else {
					require.Equal(t, authority.KindStale, outs[0].kind)
					fx.RequireMissing(r.Key)
				}
			}
			u := fx.Usage(NodeA, NodeLifecycle, authority.ObjectUserSpot, DefaultStableType)
			require.Zero(t, u.Reserved)
		}},
		{"CompleteCreationRetriesOneWinner", func(t *testing.T, fx *Fixture) {
			r := fx.Reserve(authority.ObjectActor, "a1", TargetA)
			req := r.CompleteRequest(authority.TerminalCreated, []byte("ready"), fx.Publication())
			outs := make([]outcome, Contention)
			race(Contention, func(i int) {
				res, err := fx.Store().CompleteCreation(fx.Ctx(), req)
				outs[i] = outcome{res.Kind, err}
			})
			require.Equal(t, map[authority.ResultKind]int{authority.KindCreated: 1, authority.KindAlreadyCompleted: Contention - 1}, count(t, outs))
			fx.RequireUsage(NodeA, authority.ObjectActor, "", 1, 0)
		}},
		{"PrepareAggregateOneWinner", func(t *testing.T, fx *Fixture) {
			m := newMove(fx)
			outs := make([]outcome, Contention)
			race(Contention, func(i int) {
				res, err := fx.Store().PrepareAggregate(fx.Ctx(), *m.req.Clone())
				outs[i] = outcome{res.Kind, err}
			})
			require.Equal(t, map[authority.ResultKind]int{authority.KindPrepared: 1, authority.KindAlreadyPrepared: Contention - 1}, count(t, outs))
			fx.RequireUsage(NodeB, authority.ObjectActor, "", 1, 1)
		}},
		{"CommitAggregateOneWinner", func(t *testing.T, fx *Fixture) {
			m := newMove(fx)
			fence := fx.MustPrepare(m.req)
			outs := make([]outcome, Contention)
			race(Contention, func(i int) {
				res, err := fx.Store().CommitAggregate(fx.Ctx(), fence)
				outs[i] = outcome{res.Kind, err}
			})
			require.Equal(t, map[authority.ResultKind]int{authority.KindCommitted: 1, authority.KindAlreadyCommitted: Contention - 1}, count(t, outs))
			fx.RequireUsage(NodeB, authority.ObjectActor, "", 2, 0)
			fx.RequireUsage(NodeA, authority.ObjectActor, "", 0, 0)
		}},
		{"RemoveAllByOwnerRacesReserve", func(t *testing.T, fx *Fixture) {
			for i := 0; i < 4; i++ {
				fx.Active(authority.ObjectActor, fmt.Sprintf("old%d", i), TargetA)
			}
			reqs := make([]authority.ReserveRequest, 8)
			for i := range reqs {
				reqs[i] = fx.ReserveRequest(authority.ObjectActor, fmt.Sprintf("new%d", i), TargetA)
			}
			var removed int64
			var removeErr error
			outs := make([]outcome, len(reqs))
			race(len(reqs)+1, func(i int) {
				if i == len(reqs) {
					removed, removeErr = fx.Store().RemoveAllByOwner(fx.Ctx(), OwnerA)
					return
				}
				res, err := fx.Store().Reserve(fx.Ctx(), reqs[i])
				outs[i] = outcome{res.Kind, err}
			})
			require.NoError(t, removeErr)
			kinds := count(t, outs)
			require.Equal(t, len(reqs), kinds[authority.KindReserved])
			left := fx.ListAll(authority.KindPrefix(authority.ObjectActor), 100)
			require.Equal(t, int64(4+len(reqs)), removed+int64(len(left)), "every row is removed or left, none twice")
			active := fx.ActorUsage(NodeA)
			require.Equal(t, int64(len(left)), active.Active+active.Reserved, "capacity matches the rows left")
		}},
	})
}
