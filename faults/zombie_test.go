package faults_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdcluster"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
)

// zombieRounds × 6 attempts is the number of zombie attempts per case.
const zombieRounds = 20

// zombiePayload marks every payload a zombie tries to write.
const zombiePayload = "zombie-"

// zombie is an owner whose lease is gone, with the rows it held.
type zombie struct {
	st     *etcdstore.Store
	tgt    authority.CreationTarget
	keep   authority.Key // active row it still owns
	moved  authority.Key // active row its replacement took over
	staleV authority.StoreVersion
	spot   reservation // reserved Spot of the zombie
	actor  reservation // reserved Actor of the zombie
	seq    int
}

// placeZombieRows creates the zombie's rows while its owner is live.
func placeZombieRows(t *testing.T, st *etcdstore.Store, tgt authority.CreationTarget, tag string) *zombie {
	z := &zombie{st: st, tgt: tgt}
	for _, id := range []string{tag + "-keep", tag + "-moved"} {
		r := mustReserve(t, st, reserveRequest(authority.ObjectUserSpot, id, tgt, id+"-creating"))
		row := mustCommit(t, st, r, id+"-ready")
		if strings.HasSuffix(id, "-keep") {
			z.keep = objectKey(t, authority.ObjectUserSpot, id)
		} else {
			z.moved, z.staleV = objectKey(t, authority.ObjectUserSpot, id), row.StoreVersion
		}
	}
	z.spot = mustReserve(t, st, reserveRequest(authority.ObjectUserSpot, tag+"-pending", tgt, tag+"-pending-creating"))
	z.actor = mustReserve(t, st, reserveRequest(authority.ObjectActor, tag+"-pending", tgt, tag+"-pending-actor"))
	return z
}

// attempts makes one round of zombie writes: each is answered (faults are
// retried) and must be refused. It returns how many were made and how many
// succeeded.
func (z *zombie) attempts(t *testing.T) (made, succeeded int) {
	t.Helper()
	try := func(what string, fn func(ctx context.Context, payload string) (authority.ResultKind, error)) {
		z.seq++
		payload := fmt.Sprintf("%s%d", zombiePayload, z.seq)
		eventually(t, "zombie "+what, func(ctx context.Context) error {
			kind, err := fn(ctx, payload)
			if err != nil {
				return err
			}
			made++
			switch kind {
			case authority.KindStored, authority.KindDeleted, authority.KindReserved, authority.KindCommitted,
				authority.KindCreated, authority.KindAborted, authority.KindPrepared:
				succeeded++
				t.Errorf("zombie %s succeeded: %s", what, kind)
			}
			return nil
		})
	}
	var keepV authority.StoreVersion
	eventually(t, "zombie read", func(ctx context.Context) error {
		r, err := z.st.ReadAuthority(ctx, z.keep)
		if err == nil && r.Kind == authority.KindSnapshot {
			keepV = r.Snapshot.StoreVersion
		}
		return err
	})
	try("put at the current version", func(ctx context.Context, p string) (authority.ResultKind, error) {
		res, err := z.st.CompareExchangeAuthority(ctx, z.keep, keepV, authority.Put([]byte(p)))
		return res.Kind, err
	})
	try("delete at the current version", func(ctx context.Context, _ string) (authority.ResultKind, error) {
		res, err := z.st.CompareExchangeAuthority(ctx, z.keep, keepV, authority.Delete())
		return res.Kind, err
	})
	try("put on a row taken over", func(ctx context.Context, p string) (authority.ResultKind, error) {
		res, err := z.st.CompareExchangeAuthority(ctx, z.moved, z.staleV, authority.Put([]byte(p)))
		return res.Kind, err
	})
	try("reserve", func(ctx context.Context, p string) (authority.ResultKind, error) {
		res, err := z.st.Reserve(ctx, reserveRequest(authority.ObjectUserSpot, p, z.tgt, p))
		return res.Kind, err
	})
	try("commit", func(ctx context.Context, p string) (authority.ResultKind, error) {
		res, err := z.st.Commit(ctx, z.spot.commit(p))
		return res.Kind, err
	})
	try("completeCreation", func(ctx context.Context, p string) (authority.ResultKind, error) {
		res, err := z.st.CompleteCreation(ctx, z.actor.complete(p, publication(uint64(z.seq))))
		return res.Kind, err
	})
	return made, succeeded
}

// replacementRound makes the replacement owner write: a put on the row it
// took over and a new object reserved and committed. Each must succeed.
func replacementRound(t *testing.T, st *etcdstore.Store, tgt authority.CreationTarget, moved authority.Key, round int, tag string) int {
	t.Helper()
	r := mustRead(t, st, moved)
	if r.Kind != authority.KindSnapshot || r.Snapshot.Owner() != tgt.Owner {
		t.Fatalf("replacement: %s is %s owned by %+v", moved, r.Kind, r.Snapshot)
	}
	payload := fmt.Sprintf("%s-replacement-%d", tag, round)
	eventually(t, "replacement put", func(ctx context.Context) error {
		res, err := st.CompareExchangeAuthority(ctx, moved, r.Snapshot.StoreVersion, authority.Put([]byte(payload)))
		if err == nil && res.Kind != authority.KindStored &&
			!(res.Kind == authority.KindConflict && res.Current.Snapshot != nil && string(res.Current.Snapshot.Payload) == payload) {
			t.Fatalf("replacement put: %s", res.Kind)
		}
		return err
	})
	id := fmt.Sprintf("%s-new-%d", tag, round)
	res := mustReserve(t, st, reserveRequest(authority.ObjectUserSpot, id, tgt, id))
	mustCommit(t, st, res, id+"-ready")
	return 2
}

// waitExpired waits until tgt's owner is no longer live.
func waitExpired(t *testing.T, st *etcdstore.Store, tgt authority.CreationTarget) {
	t.Helper()
	deadline := time.Now().Add(settleTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		live, err := st.IsTargetLive(ctx, tgt.Descriptor(), tgt.NodeLifecycleGeneration, tgt.Owner)
		cancel()
		if err == nil && !live {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the zombie's lease did not expire within %v (live=%v, err=%v)", settleTimeout, live, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// requireUntouched requires that no zombie payload reached any row and that
// the zombie's own rows are as it left them.
func requireUntouched(t *testing.T, st *etcdstore.Store, z *zombie, keep *authority.Snapshot) {
	t.Helper()
	for key, row := range listAll(t, st, "") {
		if strings.HasPrefix(string(row.Payload), zombiePayload) {
			t.Errorf("zombie write reached %s: %q", key, row.Payload)
		}
	}
	if r := mustRead(t, st, z.keep); r.Kind != authority.KindSnapshot || r.Snapshot.StoreVersion != keep.StoreVersion {
		t.Errorf("the zombie's row %s changed: %+v", z.keep, r.Snapshot)
	}
	for _, res := range []reservation{z.spot, z.actor} {
		key, _ := res.req.Key.Encode()
		if r := mustRead(t, st, key); r.Kind != authority.KindSnapshot || r.Snapshot.StoreVersion != res.row.StoreVersion {
			t.Errorf("the zombie's reservation %s changed: %+v", key, r.Snapshot)
		}
	}
}

// TestZombieOwnerCannotWrite: an owner whose lease expired gets no write,
// reserve, commit or completion through, while its replacement proceeds.
// Two ways to become a zombie: its keep-alive stopped, or its client was
// partitioned from the cluster (blackholed proxy) until the lease expired —
// with writes sent during the partition delivered after it heals.
func TestZombieOwnerCannotWrite(t *testing.T) {
	c, cli := startCluster(t, etcdcluster.Options{})
	const ns = "/faults/zombie/"
	main := newStore(t, cli, ns)

	t.Run("keepalive-stopped", func(t *testing.T) {
		zt := conformance.Target(conformance.NodeA, conformance.NodeLifecycle, authority.OwnerToken{OwnerID: "zombie-e", LeaseGeneration: 1})
		markLive(t, main, zt, ownerTTL) // renewed by hand below, then left to expire
		zst := newStore(t, c.Client(t), ns)
		z := placeZombieRows(t, zst, zt, "expired")
		// the last keep-alive: a 2 s lease nobody renews
		markLive(t, main, zt, 2*time.Second)
		waitExpired(t, main, zt)
		keep := mustRead(t, main, z.keep).Snapshot

		rt := conformance.Target(conformance.NodeA, conformance.NodeLifecycle, authority.OwnerToken{OwnerID: "zombie-e", LeaseGeneration: 2})
		markLive(t, main, rt, ownerTTL)
		rebind(t, main, z.moved, zt.Owner, rt.Owner)
		runZombie(t, main, z, keep, rt, "keepalive-stopped", 0)
	})

	t.Run("partitioned", func(t *testing.T) {
		// the zombie talks to member 1 only; its replacement to the others
		member := 1
		zst := newStore(t, c.MemberClient(t, member), ns)
		main := newStore(t, clientOf(t, c, 0, 2), ns)
		var lease *etcdstore.OwnerLease
		eventually(t, "acquire", func(ctx context.Context) error {
			var err error
			// long enough to outlive a stalled keep-alive while the rows are
			// placed; it expires once the partition cuts the keep-alives
			lease, err = zst.Registry().Acquire(ctx, conformance.NodeA, conformance.NodeLifecycle, "zombie-p", 6*time.Second)
			return err
		})
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
			defer cancel()
			_ = lease.Close(ctx) // the lease is long gone: the revoke may fail
		})
		zt := conformance.Target(conformance.NodeA, conformance.NodeLifecycle, lease.Token())
		z := placeZombieRows(t, zst, zt, "partitioned")
		keep := mustRead(t, main, z.keep).Snapshot

		if err := c.Blackhole(member); err != nil {
			t.Fatal(err)
		}
		// writes sent into the partition: their bytes wait in the proxy and
		// reach the member after the heal, when the lease is gone
		held := 0
		for i := range 5 {
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			_, err := zst.CompareExchangeAuthority(ctx, z.keep, keep.StoreVersion, authority.Put([]byte(fmt.Sprintf("%sheld-%d", zombiePayload, i))))
			cancel()
			if err == nil {
				t.Fatalf("a write through a blackholed proxy was answered")
			}
			held++
		}
		waitExpired(t, main, zt)
		select { // the owner's deadline ran out before etcd's expiry
		case <-lease.Done():
		default:
			t.Fatal("etcd expired the lease before its cut-off owner saw Done")
		}
		var next *etcdstore.OwnerLease
		eventually(t, "acquire the next generation", func(ctx context.Context) error {
			var err error
			next, err = main.Registry().Acquire(ctx, conformance.NodeA, conformance.NodeLifecycle, "zombie-p", 10*time.Second)
			return err
		})
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
			defer cancel()
			_ = next.Close(ctx)
		})
		rt := conformance.Target(conformance.NodeA, conformance.NodeLifecycle, next.Token())
		rebind(t, main, z.moved, zt.Owner, rt.Owner)
		if err := c.Heal(member); err != nil {
			t.Fatal(err)
		}
		runZombie(t, main, z, keep, rt, "partitioned", held)
	})
}

// rebind moves the row at key from one lease generation of its owner to
// another (the replacement taking it over) and returns the moved row.
func rebind(t *testing.T, st *etcdstore.Store, key authority.Key, from, to authority.OwnerToken) *authority.Snapshot {
	t.Helper()
	r := mustRead(t, st, key)
	var moved *authority.Snapshot
	eventually(t, "rebind", func(ctx context.Context) error {
		res, err := st.CompareExchangeAuthority(ctx, key, r.Snapshot.StoreVersion, authority.RebindOwnerLease(from, to, r.Snapshot.Payload))
		switch {
		case err != nil:
		case res.Kind == authority.KindStored:
			moved = res.Snapshot
		case res.Kind == authority.KindConflict && res.Current.Snapshot != nil && res.Current.Snapshot.Owner() == to:
			moved = res.Current.Snapshot // an earlier attempt moved it
		default:
			t.Fatalf("rebind: %s", res.Kind)
		}
		return err
	})
	return moved
}

// runZombie interleaves zombie rounds with replacement rounds and checks the
// result.
func runZombie(t *testing.T, main *etcdstore.Store, z *zombie, keep *authority.Snapshot, rt authority.CreationTarget, name string, held int) {
	t.Helper()
	made, succeeded, replaced := 0, 0, 0
	for round := range zombieRounds {
		m, s := z.attempts(t)
		made, succeeded = made+m, succeeded+s
		replaced += replacementRound(t, main, rt, z.moved, round, name)
	}
	requireUntouched(t, main, z, keep)
	t.Logf("zombie-%s: attempts=%d (+%d sent into the partition) succeeded=%d replacement-writes=%d", name, made, held, succeeded, replaced)
	if made < 100 {
		t.Errorf("only %d zombie attempts were answered, want at least 100", made)
	}
}
