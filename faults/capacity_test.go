package faults_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdcluster"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
)

const (
	// capacityRun is how long the reservers of the capacity test run at
	// least; they keep going until the node was filled under both faults
	// (keepGoing).
	capacityRun = 8 * time.Second
	// capacityLimit is the node's Actor limit; capacityWorkers reserve
	// against it, each holding at most one place at a time.
	capacityLimit   = 5
	capacityWorkers = 12
)

// TestCapacityExactUnderFaults: three stores, each on its own client,
// reserve and release Actors on one node under a limit of 5 with 12 workers,
// while the nemesis kills the leader and blackholes members (so usage
// watches fail, lag and restart). Replaying every change of the node's
// capacity entries from etcd's history, the node never held more than the
// limit at any revision. After the faults, every store's decisions are
// exact: the limit is admitted, the next is refused by every store, and a
// place one store frees is admitted by another.
func TestCapacityExactUnderFaults(t *testing.T) {
	c, cli := startCluster(t, etcdcluster.Options{})
	const ns = "/faults/capacity-exact/"
	admin := newStore(t, cli, ns)
	tgt := conformance.Target(conformance.NodeA, conformance.NodeLifecycle, authority.OwnerToken{OwnerID: "cap-owner", LeaseGeneration: 1})
	markLive(t, admin, tgt, ownerTTL)
	stores := make([]*etcdstore.Store, 3)
	for i := range stores {
		stores[i] = newStore(t, c.Client(t), ns)
		stores[i].SetCapacityPolicy(conformance.ActorLimit(capacityLimit))
	}
	var startRev int64
	eventually(t, "start revision", func(ctx context.Context) error {
		resp, err := cli.Get(ctx, ns+"start")
		if err == nil {
			startRev = resp.Header.Revision
		}
		return err
	})

	seed := uint64(time.Now().UnixNano())
	t.Logf("seed=%d", seed)
	nem := newNemesis(c, seed)
	var admitted, exhausted, failed atomic.Int64
	run := keepGoing(capacityRun, func() bool {
		faults, _ := nem.injected()
		return admitted.Load() > 0 && exhausted.Load() > 0 && faults >= 2
	})
	defer run.stop()
	ctx := run.ctx
	nemErr := make(chan error, 1)
	go func() {
		nemErr <- nem.cycle(ctx, 700*time.Millisecond,
			func(ctx context.Context) error { return nem.killLeader(ctx, 700*time.Millisecond) },
			func(ctx context.Context) error { return nem.partition(ctx, "blackhole", time.Second) },
		)
	}()
	var wg sync.WaitGroup
	for w := range capacityWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st := stores[w%len(stores)]
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			for i := 0; ctx.Err() == nil; i++ {
				req := reserveRequest(authority.ObjectActor, fmt.Sprintf("w%d-%d", w, i), tgt, fmt.Sprintf("w%d-%d", w, i))
				octx, ocancel := context.WithTimeout(ctx, opTimeout)
				res, err := st.Reserve(octx, req)
				ocancel()
				switch {
				case err != nil:
					failed.Add(1)
				case res.Kind == authority.KindReserved:
					admitted.Add(1)
					sleepCtx(ctx, time.Duration(rng.IntN(30))*time.Millisecond)
				case res.Kind == authority.KindPlacementCapacityExhausted:
					exhausted.Add(1)
					sleepCtx(ctx, 2*time.Millisecond)
				default:
					t.Errorf("reserve %s: %s", req.Key.GlobalID, res.Kind)
					return
				}
				// release whatever the attempt left (an unknown outcome may
				// have reserved): the row, if it is this attempt's
				releaseReserved(st, req)
			}
		}()
	}
	wg.Wait()
	if err := <-nemErr; err != nil {
		t.Fatalf("nemesis: %v", err)
	}
	_, ran := run.report()
	waitHealthy(t, c)
	faults, kinds := nem.injected()
	peak := requireNeverOverAdmitted(t, cli, ns, startRev)
	t.Logf("capacity: ran %.1fs (planned %v) limit=%d workers=%d admitted=%d exhausted=%d failed=%d peak=%d faults=%d (%s)",
		ran.Seconds(), capacityRun, capacityLimit, capacityWorkers, admitted.Load(), exhausted.Load(), failed.Load(), peak, faults, kinds)
	if admitted.Load() == 0 || exhausted.Load() == 0 || peak != capacityLimit {
		t.Errorf("the run never filled the node: it tests nothing")
	}
	if faults < 2 {
		t.Errorf("the nemesis injected %d faults; the run needs a leader kill and a blackhole", faults)
	}

	// after the faults: every store decides exactly
	for round := range len(stores) {
		eventually(t, "remove the owner's rows", func(ctx context.Context) error {
			_, err := admin.RemoveAllByOwner(ctx, tgt.Owner)
			return err
		})
		filler := stores[round]
		var held []reservation
		for i := range capacityLimit {
			held = append(held, mustReserve(t, filler, reserveRequest(authority.ObjectActor, fmt.Sprintf("final-%d-%d", round, i), tgt, "final")))
		}
		for i, st := range stores {
			requireReserveKind(t, st, reserveRequest(authority.ObjectActor, fmt.Sprintf("over-%d-%d", round, i), tgt, "over"),
				authority.KindPlacementCapacityExhausted)
		}
		freer, taker := stores[(round+1)%len(stores)], stores[(round+2)%len(stores)]
		eventually(t, "abort", func(ctx context.Context) error {
			res, err := freer.Abort(ctx, held[0].abort())
			if err == nil && res.Kind != authority.KindAborted {
				t.Fatalf("abort: %s", res.Kind)
			}
			return err
		})
		requireReserveKind(t, taker, reserveRequest(authority.ObjectActor, fmt.Sprintf("freed-%d", round), tgt, "freed"), authority.KindReserved)
		for i, st := range stores {
			requireReserveKind(t, st, reserveRequest(authority.ObjectActor, fmt.Sprintf("full-%d-%d", round, i), tgt, "full"),
				authority.KindPlacementCapacityExhausted)
		}
	}
}

// releaseReserved aborts the reservation req made, if its row is there and
// reserved by it (the creating payload names the attempt), retrying faults
// for a while; it gives up quietly (the place stays held).
func releaseReserved(st *etcdstore.Store, req authority.ReserveRequest) {
	key, err := authority.EncodeKey(req.Key.Kind, req.Key.GlobalID)
	if err != nil {
		return
	}
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		err := func() error {
			read, err := st.ReadAuthority(ctx, key)
			if err != nil || read.Kind != authority.KindSnapshot {
				return err
			}
			s := read.Snapshot
			if s.PendingCreation == nil || string(s.Payload) != string(req.CreatingPayload) {
				return nil
			}
			_, err = st.Abort(ctx, authority.AbortRequest{Key: req.Key, ReservationID: s.PendingCreation.ReservationID,
				ExpectedStoreVersion: s.StoreVersion, Target: req.Target})
			if err == nil {
				return errRetry // read again: gone now, or changed
			}
			return err
		}()
		cancel()
		if err == nil {
			return
		}
		time.Sleep(retryPause)
	}
}

var errRetry = fmt.Errorf("read again")

// requireReserveKind reserves req through st (retrying faults) and requires
// the outcome kind.
func requireReserveKind(t *testing.T, st *etcdstore.Store, req authority.ReserveRequest, want authority.ResultKind) {
	t.Helper()
	eventually(t, "reserve "+req.Key.GlobalID, func(ctx context.Context) error {
		res, err := st.Reserve(ctx, req)
		if err == nil && res.Kind != want {
			t.Fatalf("reserve %s: %s, want %s", req.Key.GlobalID, res.Kind, want)
		}
		return err
	})
}

// requireNeverOverAdmitted replays every change of the capacity entries
// under ns from rev on (etcd's history, no compaction in these clusters) and
// requires the Actors they hold to stay within capacityLimit after every
// revision. It returns the most they held.
func requireNeverOverAdmitted(t *testing.T, cli *clientv3.Client, ns string, rev int64) int64 {
	t.Helper()
	ctx := settle(t)
	// an end marker just past the entries' range: "capacity0" sorts right
	// after every "capacity/..." key, and no store reads it
	prefix := schema.Prefix(ns, schema.EntryCapacity)
	marker := ns + "capacity0"
	if _, err := cli.Put(ctx, marker, ""); err != nil {
		t.Fatal(err)
	}
	held := map[string]int64{}
	var total, peak int64
	last := rev
	check := func() {
		if total > capacityLimit {
			t.Fatalf("at revision %d the node holds %d Actors, over its limit of %d", last, total, capacityLimit)
		}
		peak = max(peak, total)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := false
	for wr := range cli.Watch(wctx, prefix, clientv3.WithRange(marker+"\x00"), clientv3.WithRev(rev+1)) {
		if err := wr.Err(); err != nil {
			t.Fatalf("replaying the capacity entries: %v", err)
		}
		for _, ev := range wr.Events {
			if r := ev.Kv.ModRevision; r != last {
				check()
				last = r
			}
			k := string(ev.Kv.Key)
			if k == marker {
				done = true
				break
			}
			total -= held[k]
			delete(held, k)
			if ev.Type == clientv3.EventTypePut {
				e, err := schema.DecodeEntry(ns, ev.Kv)
				if err != nil {
					t.Fatalf("decode %s: %v", k, err)
				}
				held[k] = e.Capacity.Vector.Actors
				total += held[k]
			}
		}
		if done {
			break
		}
	}
	if !done {
		t.Fatal("the replay ended before its end marker")
	}
	check()
	return peak
}
