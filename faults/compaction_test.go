package faults_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
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
	// compactionRun is how long the workload runs at least (AUTHORITY_SOAK:
	// longer); it keeps going until it exercised every part of the scenario
	// (keepGoing).
	compactionRun = 12 * time.Second
	// compactionPause is the pause between compactions while listings
	// complete; while none has, the pause is twice the longest listing the
	// run measured, so one can.
	compactionPause = 150 * time.Millisecond
	// compactionStable and compactionChurn are the listed rows: the stable
	// ones never change, the churned ones are rewritten all the time.
	compactionStable, compactionChurn = 48, 16
	// compactionPage is the listings' page size.
	compactionPage = 7
	// compactionLimit is the node's Actor limit the reservers work against.
	compactionLimit = 3
)

// compactionStats counts what the compaction test saw.
type compactionStats struct {
	listings, torn, expired, pageRetries atomic.Int64
	compactions, defrags                 atomic.Int64
	watchChanges, rereads, missed        atomic.Int64
	admitted, exhausted                  atomic.Int64
	// longestListing and slowestRead (ns) are measured by the run: the
	// compactor's pause and the waits' tolerance derive from them
	longestListing, slowestRead atomic.Int64
}

// exercised reports whether the run saw every part of its scenario.
func (s *compactionStats) exercised() bool {
	return s.compactions.Load() >= 3 && s.listings.Load() > 0 && s.expired.Load() > 0 &&
		s.watchChanges.Load() > 0 && s.admitted.Load() > 0
}

// raise sets *a to v when v is larger.
func raise(a *atomic.Int64, v int64) {
	for cur := a.Load(); v > cur && !a.CompareAndSwap(cur, v); cur = a.Load() {
	}
}

// TestCompactionDuringListingsAndWatches: while rows are rewritten and
// Actors reserved and released under a capacity limit, the cluster is
// compacted to its current revision and every member defragmented, round
// after round. Paged listings either complete at one revision (no row twice
// or out of order, every row there, each at its version of one revision of
// etcd's history) or end with KindScanExpired. WaitForChange returns when
// its row changes (or, after a compaction, for a re-read) and never sleeps
// through a change. The usage watches that capacity decisions use are
// broken by the compactions (a rewrite's previous value is compacted away);
// an independent watch of the capacity entries shows the node never held
// more than its limit, and afterwards every store decides exactly.
func TestCompactionDuringListingsAndWatches(t *testing.T) {
	c, cli := startCluster(t, etcdcluster.Options{})
	const ns = "/faults/compaction/"
	rowOwner := conformance.Target(conformance.NodeA, conformance.NodeLifecycle, authority.OwnerToken{OwnerID: "cmp-rows", LeaseGeneration: 1})
	actorOwner := conformance.Target(conformance.NodeA, conformance.NodeLifecycle, authority.OwnerToken{OwnerID: "cmp-actors", LeaseGeneration: 1})
	admin := newStore(t, cli, ns)
	markLive(t, admin, rowOwner, ownerTTL)
	markLive(t, admin, actorOwner, ownerTTL)
	stores := make([]*etcdstore.Store, 3)
	for i := range stores {
		stores[i] = newStore(t, c.Client(t), ns)
		stores[i].SetCapacityPolicy(conformance.ActorLimit(compactionLimit))
	}
	hist := startKeyHistory(t, cli, ns)

	stable, churn := placeCompactionRows(t, admin, rowOwner)
	planned := compactionRun
	if soak() {
		planned = time.Minute
	}
	var stats compactionStats
	run := keepGoing(planned, stats.exercised)
	defer run.stop()
	ctx := run.ctx
	var wg sync.WaitGroup
	spawn := func(fn func()) { wg.Add(1); go func() { defer wg.Done(); fn() }() }
	spawn(func() { compactLoop(ctx, t, c, cli, hist, &stats) })
	for i := range 2 {
		spawn(func() { churnRows(ctx, stores[i], churn, uint64(i)) })
		spawn(func() { listLoop(ctx, t, stores[i], stable, churn, hist, &stats) })
		spawn(func() { waitLoop(ctx, t, stores[i], churn[i], hist, &stats) })
	}
	for w := range 6 {
		spawn(func() { reserveActors(ctx, t, stores[w%len(stores)], actorOwner, w, &stats) })
	}
	wg.Wait()
	exercised, ran := run.report()
	waitHealthy(t, c)
	peak := hist.stop(t)
	requireExactCapacity(t, admin, stores, actorOwner)
	t.Logf("compaction: ran %.1fs (planned %v) listings=%d torn=%d scan-expired=%d watch-changes=%d rereads=%d missed=%d over-admitted=%d "+
		"(compactions=%d defrags=%d page-retries=%d admitted=%d exhausted=%d peak=%d longest-listing=%v slowest-read=%v)",
		ran.Seconds(), planned, stats.listings.Load(), stats.torn.Load(), stats.expired.Load(), stats.watchChanges.Load(), stats.rereads.Load(),
		stats.missed.Load(), max(0, peak-compactionLimit), stats.compactions.Load(), stats.defrags.Load(),
		stats.pageRetries.Load(), stats.admitted.Load(), stats.exhausted.Load(), peak,
		time.Duration(stats.longestListing.Load()), time.Duration(stats.slowestRead.Load()))
	if stats.torn.Load() != 0 || stats.missed.Load() != 0 || peak > compactionLimit {
		t.Errorf("torn=%d missed=%d peak=%d (limit %d)", stats.torn.Load(), stats.missed.Load(), peak, compactionLimit)
	}
	if !exercised {
		t.Errorf("in %.1fs (%d× the planned %v) the run did not exercise compaction against completed and expired listings, waits and reservations",
			ran.Seconds(), exerciseBound, planned)
	}
}

// placeCompactionRows creates the stable and the churned rows and returns
// the stable rows' versions and the churned rows' keys.
func placeCompactionRows(t *testing.T, st *etcdstore.Store, tgt authority.CreationTarget) (map[authority.Key]authority.StoreVersion, []authority.Key) {
	t.Helper()
	stable := map[authority.Key]authority.StoreVersion{}
	var churn []authority.Key
	for i := range compactionStable + compactionChurn {
		id := fmt.Sprintf("cmp-%03d", i)
		row := mustCommit(t, st, mustReserve(t, st, reserveRequest(authority.ObjectUserSpot, id, tgt, id)), id+"-ready")
		key := objectKey(t, authority.ObjectUserSpot, id)
		if i%4 == 3 {
			churn = append(churn, key)
		} else {
			stable[key] = row.StoreVersion
		}
	}
	return stable, churn
}

// compactLoop compacts to the current revision (once the history watch has
// seen it, so the independent record stays whole) and defragments every
// member, again and again: compactionPause apart, or, while no listing has
// completed, twice the longest listing measured apart.
func compactLoop(ctx context.Context, t *testing.T, c *etcdcluster.Cluster, cli *clientv3.Client, hist *keyHistory, stats *compactionStats) {
	pause := func() time.Duration {
		if stats.listings.Load() > 0 {
			return compactionPause
		}
		return max(compactionPause, 2*time.Duration(stats.longestListing.Load()))
	}
	for sleepCtx(ctx, pause()) {
		rctx, cancel := context.WithTimeout(ctx, opTimeout)
		resp, err := cli.Get(rctx, "compaction-probe")
		cancel()
		if err != nil || !hist.reached(ctx, resp.Header.Revision) {
			continue
		}
		rctx, cancel = context.WithTimeout(ctx, 3*time.Second)
		_, err = cli.Compact(rctx, resp.Header.Revision, clientv3.WithCompactPhysical())
		cancel()
		if err != nil {
			continue
		}
		stats.compactions.Add(1)
		for i := range c.Size() {
			rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			if _, err := cli.Defragment(rctx, c.Endpoint(i)); err == nil {
				stats.defrags.Add(1)
			}
			cancel()
		}
	}
}

// churnRows rewrites random churned rows until ctx ends.
func churnRows(ctx context.Context, st *etcdstore.Store, keys []authority.Key, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 7))
	for n := 0; ctx.Err() == nil; n++ {
		key := keys[rng.IntN(len(keys))]
		octx, cancel := context.WithTimeout(ctx, opTimeout)
		if r, err := st.ReadAuthority(octx, key); err == nil && r.Kind == authority.KindSnapshot {
			_, _ = st.CompareExchangeAuthority(octx, key, r.Snapshot.StoreVersion, authority.Put([]byte(fmt.Sprintf("churn-%d-%d", seed, n))))
		}
		cancel()
		sleepCtx(ctx, 10*time.Millisecond)
	}
}

// listLoop lists the rows page by page until ctx ends and checks every
// listing that completes.
func listLoop(ctx context.Context, t *testing.T, st *etcdstore.Store, stable map[authority.Key]authority.StoreVersion, churn []authority.Key, hist *keyHistory, stats *compactionStats) {
	prefix := strings.TrimSuffix(string(objectKey(t, authority.ObjectUserSpot, "cmp-x")), "x")
	for ctx.Err() == nil {
		var items []authority.ScanItem
		cursor := authority.ScanCursor("")
		expired := false
		began := time.Now()
		for ctx.Err() == nil {
			octx, cancel := context.WithTimeout(ctx, opTimeout)
			page, err := st.ListAuthorities(octx, prefix, cursor, compactionPage)
			cancel()
			if err != nil {
				if !transient(err) && ctx.Err() == nil {
					t.Errorf("list: %v", err)
					return
				}
				stats.pageRetries.Add(1)
				continue
			}
			if page.Kind == authority.KindScanExpired {
				expired = true
				break
			}
			items = append(items, page.Items...)
			if cursor = page.NextCursor; cursor == "" {
				break
			}
			sleepCtx(ctx, 15*time.Millisecond) // let a compaction in between
		}
		raise(&stats.longestListing, int64(time.Since(began)))
		switch {
		case expired:
			stats.expired.Add(1)
		case ctx.Err() == nil:
			stats.listings.Add(1)
			if why := tornListing(items, stable, churn, hist); why != "" {
				stats.torn.Add(1)
				t.Errorf("torn listing: %s", why)
			}
		}
	}
}

// tornListing returns why a completed listing is not one revision of the
// rows ("" when it is): a row twice or out of order, a row missing, a
// stable row at another version, or no revision of etcd's history at which
// every listed row had the version listed.
func tornListing(items []authority.ScanItem, stable map[authority.Key]authority.StoreVersion, churn []authority.Key, hist *keyHistory) string {
	if len(items) != len(stable)+len(churn) {
		return fmt.Sprintf("%d rows listed, want %d", len(items), len(stable)+len(churn))
	}
	lo, hi := int64(0), int64(1)<<62 // the revisions the listing can be at
	for i, it := range items {
		if i > 0 && items[i-1].Key >= it.Key {
			return fmt.Sprintf("%s listed after %s", it.Key, items[i-1].Key)
		}
		if v, ok := stable[it.Key]; ok && it.Snapshot.StoreVersion != v {
			return fmt.Sprintf("stable row %s at version %s, want %s", it.Key, it.Snapshot.StoreVersion, v)
		}
		var rev int64
		if _, err := fmt.Sscan(string(it.Snapshot.StoreVersion), &rev); err != nil {
			return fmt.Sprintf("row %s version %q", it.Key, it.Snapshot.StoreVersion)
		}
		next, ok := hist.nextChange(compactionRowKey(it.Key), rev)
		if !ok {
			return fmt.Sprintf("row %s at version %d, which etcd's history does not hold", it.Key, rev)
		}
		lo, hi = max(lo, rev), min(hi, next)
	}
	if lo >= hi {
		return fmt.Sprintf("no single revision: a row was written at %d, another was rewritten at %d", lo, hi)
	}
	return ""
}

// compactionRowKey is the etcd key of the row at key in the compaction
// test's namespace.
func compactionRowKey(key authority.Key) string {
	return schema.Prefix("/faults/compaction/", schema.EntryRow) + string(key)
}

// waitLoop waits for changes of key with WaitForChange until ctx ends. A
// wait that times out while the independent watch saw the row change well
// before the timeout missed a change: more than half the wait before, and
// the wait is at least 2 s and 8 times the slowest read the run measured,
// so a loaded machine's slow delivery is not taken for a miss.
func waitLoop(ctx context.Context, t *testing.T, st *etcdstore.Store, key authority.Key, hist *keyHistory, stats *compactionStats) {
	for ctx.Err() == nil {
		octx, cancel := context.WithTimeout(ctx, opTimeout)
		began := time.Now()
		r, err := st.ReadAuthority(octx, key)
		cancel()
		if err == nil {
			raise(&stats.slowestRead, int64(time.Since(began)))
		}
		wait := max(2*time.Second, 8*time.Duration(stats.slowestRead.Load()))
		if err != nil || r.Kind != authority.KindSnapshot {
			continue
		}
		seen := r.Snapshot.StoreVersion
		var rev int64
		fmt.Sscan(string(seen), &rev)
		wctx, cancel := context.WithTimeout(ctx, wait)
		err = st.WaitForChange(wctx, key, seen)
		deadline, _ := wctx.Deadline()
		cancel()
		switch {
		case err == nil:
			octx, cancel := context.WithTimeout(ctx, opTimeout)
			now, rerr := st.ReadAuthority(octx, key)
			cancel()
			switch {
			case rerr != nil:
			case now.Kind != authority.KindSnapshot || now.Snapshot.StoreVersion != seen:
				stats.watchChanges.Add(1)
			default:
				stats.rereads.Add(1) // a compaction ended the watch: read again
			}
		case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
			if at, ok := hist.changedAt(compactionRowKey(key), rev); ok && at.Before(deadline.Add(-wait/2)) {
				stats.missed.Add(1)
				t.Errorf("WaitForChange(%s, %s) slept through a change etcd made %v before its deadline", key, seen, deadline.Sub(at))
			}
		case err != nil && !transient(err) && ctx.Err() == nil:
			t.Errorf("WaitForChange: %v", err)
			return
		}
	}
}

// reserveActors reserves Actors of owner and releases them until ctx ends.
func reserveActors(ctx context.Context, t *testing.T, st *etcdstore.Store, tgt authority.CreationTarget, w int, stats *compactionStats) {
	for i := 0; ctx.Err() == nil; i++ {
		req := reserveRequest(authority.ObjectActor, fmt.Sprintf("cmp-w%d-%d", w, i), tgt, fmt.Sprintf("w%d-%d", w, i))
		octx, cancel := context.WithTimeout(ctx, opTimeout)
		res, err := st.Reserve(octx, req)
		cancel()
		switch {
		case err != nil:
		case res.Kind == authority.KindReserved:
			stats.admitted.Add(1)
			sleepCtx(ctx, 20*time.Millisecond)
		case res.Kind == authority.KindPlacementCapacityExhausted:
			stats.exhausted.Add(1)
			sleepCtx(ctx, 5*time.Millisecond)
		default:
			t.Errorf("reserve %s: %s", req.Key.GlobalID, res.Kind)
			return
		}
		releaseReserved(st, req)
	}
}

// requireExactCapacity removes owner's Actors, fills the node to its limit
// through the first store and requires every store to refuse the next.
func requireExactCapacity(t *testing.T, admin *etcdstore.Store, stores []*etcdstore.Store, owner authority.CreationTarget) {
	t.Helper()
	eventually(t, "remove the Actors", func(ctx context.Context) error {
		_, err := admin.RemoveAllByOwner(ctx, owner.Owner)
		return err
	})
	for i := range compactionLimit {
		mustReserve(t, stores[0], reserveRequest(authority.ObjectActor, fmt.Sprintf("cmp-final-%d", i), owner, "final"))
	}
	for i, st := range stores {
		requireReserveKind(t, st, reserveRequest(authority.ObjectActor, fmt.Sprintf("cmp-over-%d", i), owner, "over"),
			authority.KindPlacementCapacityExhausted)
	}
}
