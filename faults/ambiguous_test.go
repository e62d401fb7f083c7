package faults_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdcluster"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
)

// ambiguousTrials is the number of lost-reply trials per operation.
const ambiguousTrials = 6

// ambiguousOp is one idempotent operation whose reply gets lost.
type ambiguousOp struct {
	name string
	kind authority.ObjectKind
	// first and retry send the operation; they return its result kind.
	send func(ctx context.Context, st *etcdstore.Store, r reservation, n int) (authority.ResultKind, error)
	// retried is the kind a retry must report once the first one applied.
	retried authority.ResultKind
	// check requires the effect of exactly one application, with done
	// trials applied so far; it reports whether it found it.
	check func(t *testing.T, obs *etcdstore.Store, r reservation, n, done int) bool
}

// TestAmbiguousRepliesRetryIdempotently loses the reply of a commit, an
// abort and a completeCreation (the proxy the client uses holds replies
// while requests go through): the first attempt fails with
// ErrOutcomeUnknown, the effect shows up on the other members, and retrying
// the same request reports alreadyCommitted / alreadyAborted /
// alreadyCompleted, never a second creation.
func TestAmbiguousRepliesRetryIdempotently(t *testing.T) {
	c, _ := startCluster(t, etcdcluster.Options{})
	const ns = "/faults/ambiguous/"
	const member = 2
	amb := newStore(t, c.MemberClient(t, member), ns) // its replies get lost
	obs := newStore(t, clientOf(t, c, 0, 1), ns)      // the observer

	node := func(name string) authority.CreationTarget {
		return conformance.Target(authority.NodeDescriptor{MeshName: "mesh-1", RID: "amb-" + name}, conformance.NodeLifecycle,
			authority.OwnerToken{OwnerID: "amb-" + name, LeaseGeneration: 1})
	}
	usage := func(t *testing.T, tgt authority.CreationTarget, kind authority.ObjectKind) authority.CapacityUsage {
		var u authority.CapacityUsage
		eventually(t, "capacity usage", func(ctx context.Context) error {
			var err error
			u, err = obs.CapacityUsage(ctx, tgt.Descriptor(), tgt.NodeLifecycleGeneration, kind, conformance.DefaultStableType)
			return err
		})
		return u
	}
	pubs := map[int]*authority.TerminalPublication{}
	ops := []ambiguousOp{
		{
			name: "commit", kind: authority.ObjectUserSpot, retried: authority.KindAlreadyCommitted,
			send: func(ctx context.Context, st *etcdstore.Store, r reservation, n int) (authority.ResultKind, error) {
				res, err := st.Commit(ctx, r.commit(fmt.Sprintf("ready-%d", n)))
				return res.Kind, err
			},
			check: func(t *testing.T, obs *etcdstore.Store, r reservation, n, done int) bool {
				ok := true
				key, _ := r.req.Key.Encode()
				row := mustRead(t, obs, key).Snapshot
				if row == nil || row.Allocation.State != authority.AllocationActive ||
					row.ObjectGeneration != r.row.ObjectGeneration || string(row.Payload) != fmt.Sprintf("ready-%d", n) {
					t.Errorf("commit %d: row after the retries: %+v", n, row)
					ok = false
				}
				if u := usage(t, r.req.Target, r.req.Key.Kind); u.Active != int64(done) || u.Reserved != 0 {
					t.Errorf("commit %d: capacity active=%d reserved=%d, want %d and 0 (a duplicate creation?)", n, u.Active, u.Reserved, done)
					ok = false
				}
				return ok
			},
		},
		{
			name: "abort", kind: authority.ObjectUserSpot, retried: authority.KindAlreadyAborted,
			send: func(ctx context.Context, st *etcdstore.Store, r reservation, _ int) (authority.ResultKind, error) {
				res, err := st.Abort(ctx, r.abort())
				return res.Kind, err
			},
			check: func(t *testing.T, obs *etcdstore.Store, r reservation, n, _ int) bool {
				ok := true
				key, _ := r.req.Key.Encode()
				if got := mustRead(t, obs, key); got.Kind != authority.KindMissing {
					t.Errorf("abort %d: row after the retries: %s %+v", n, got.Kind, got.Snapshot)
					ok = false
				}
				if u := usage(t, r.req.Target, r.req.Key.Kind); u.Active != 0 || u.Reserved != 0 {
					t.Errorf("abort %d: capacity active=%d reserved=%d, want 0 and 0", n, u.Active, u.Reserved)
					ok = false
				}
				return ok
			},
		},
		{
			name: "completeCreation", kind: authority.ObjectActor, retried: authority.KindAlreadyCompleted,
			send: func(ctx context.Context, st *etcdstore.Store, r reservation, n int) (authority.ResultKind, error) {
				if pubs[n] == nil {
					pubs[n] = publication(uint64(n))
				}
				res, err := st.CompleteCreation(ctx, r.complete(fmt.Sprintf("ready-%d", n), pubs[n]))
				return res.Kind, err
			},
			check: func(t *testing.T, obs *etcdstore.Store, r reservation, n, done int) bool {
				ok := true
				key, _ := r.req.Key.Encode()
				row := mustRead(t, obs, key).Snapshot
				if row == nil || row.Allocation.State != authority.AllocationActive ||
					row.ObjectGeneration != r.row.ObjectGeneration || string(row.Payload) != fmt.Sprintf("ready-%d", n) {
					t.Errorf("completeCreation %d: row after the retries: %+v", n, row)
					ok = false
				}
				var term authority.TerminalReadResult
				eventually(t, "read terminal", func(ctx context.Context) error {
					var err error
					term, err = obs.ReadCreationTerminal(ctx, pubs[n].Operation)
					return err
				})
				if term.Kind != authority.KindFound || term.Record.ReservationID != r.id ||
					!bytes.Equal(term.Record.TerminalEnvelope, pubs[n].TerminalEnvelope) {
					t.Errorf("completeCreation %d: terminal %s %+v", n, term.Kind, term.Record)
					ok = false
				}
				if u := usage(t, r.req.Target, r.req.Key.Kind); u.Active != int64(done) || u.Reserved != 0 {
					t.Errorf("completeCreation %d: capacity active=%d reserved=%d, want %d and 0 (a duplicate creation?)", n, u.Active, u.Reserved, done)
					ok = false
				}
				return ok
			},
		},
	}

	n := 0
	for _, op := range ops {
		t.Run(op.name, func(t *testing.T) {
			tgt := node(op.name)
			markLive(t, obs, tgt, ownerTTL)
			// one lost-free run first: the store's shared record leases exist
			warm := mustReserve(t, amb, reserveRequest(op.kind, op.name+"-warm", tgt, "warm"))
			n++
			tries := 0
			eventually(t, "warm-up "+op.name, func(ctx context.Context) error {
				kind, err := op.send(ctx, amb, warm, n)
				if tries++; err == nil && kind == op.retried && tries == 1 {
					t.Fatalf("warm-up %s: %s on the first try", op.name, kind)
				}
				return err
			})
			done := 1
			ambiguous, already, redone, duplicates := 0, 0, 0, 0
			// redo finishes an attempt that did not apply and counts it
			redo := func(r reservation, n int, cause error) {
				t.Helper()
				redone++
				eventually(t, "finish "+op.name, func(ctx context.Context) error {
					_, err := op.send(ctx, amb, r, n)
					return err
				})
				if op.kind == authority.ObjectActor || op.name == "commit" {
					done++
				}
				if redone > 3*ambiguousTrials {
					t.Fatalf("%s: %d attempts did not apply (last: %v)", op.name, redone, cause)
				}
			}
			// every attempt takes a fresh key: a redone attempt leaves its
			// row committed or completed, so reserving its key again would
			// find it there (alreadyExists)
			for trial, attempt := 0, 0; trial < ambiguousTrials; attempt++ {
				id := fmt.Sprintf("%s-%d", op.name, attempt)
				r := mustReserve(t, amb, reserveRequest(op.kind, id, tgt, id+"-creating"))
				n++
				key, _ := r.req.Key.Encode()
				if err := c.HoldReplies(member); err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), opTimeout/2)
				kind, err := op.send(ctx, amb, r, n)
				cancel()
				if err := c.Heal(member); err != nil {
					t.Fatal(err)
				}
				if !errors.Is(err, authority.ErrOutcomeUnknown) {
					// the reply was not what got lost (the request failed
					// before its Txn was sent, e.g. granting a record
					// lease): not an ambiguous trial; finish and redo it
					if err == nil {
						t.Fatalf("%s through a proxy holding replies was answered: %s", op.name, kind)
					}
					redo(r, n, err)
					continue
				}
				// the request went through: its effect reaches the other
				// members, unless its proposal was dropped (an election while
				// the replies were held), which an unknown outcome allows
				wctx, wcancel := context.WithTimeout(context.Background(), settleTimeout)
				werr := obs.WaitForChange(wctx, key, r.row.StoreVersion)
				wcancel()
				// not seen applied (the wait timed out or, in an election,
				// failed): redo it; the finish reports alreadyX if it did apply
				if now := mustRead(t, obs, key).Snapshot; werr != nil || (now != nil && now.StoreVersion == r.row.StoreVersion) {
					t.Logf("%s: the lost-reply request was not seen applied (wait: %v); redone", id, werr)
					redo(r, n, err)
					continue
				}
				ambiguous++
				if op.name != "abort" {
					done++
				}
				for range 2 { // retried twice: the same answer each time
					eventually(t, "retry "+op.name, func(ctx context.Context) error {
						kind, err := op.send(ctx, amb, r, n)
						if err == nil {
							if kind != op.retried {
								t.Errorf("%s retried: %s, want %s", id, kind, op.retried)
							} else {
								already++
							}
						}
						return err
					})
				}
				if !op.check(t, obs, r, n, done) {
					duplicates++
				}
				trial++
			}
			t.Logf("ambiguous-%s: trials=%d lost-replies=%d retried-%s=%d redone=%d duplicates-or-lost=%d",
				op.name, ambiguousTrials, ambiguous, op.retried, already, redone, duplicates)
		})
	}
}
