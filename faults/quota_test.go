package faults_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
)

// quotaBytes is the test server's --quota-backend-bytes.
const quotaBytes = 6 << 20

// quotaPayload is the size of each row's payload.
const quotaPayload = 48 << 10

// quotaFiller writes rows of two owners until the server runs out of space:
// the keeper's rows must survive, the spare's are removed to free space.
type quotaFiller struct {
	st            *etcdstore.Store
	keeper, spare authority.CreationTarget
	mu            sync.Mutex
	acked         map[authority.Key]string // committed rows of the keeper: payload
	writes, typed int
	untyped       []error
}

// fill writes until ctx ends or the server refused enough writes.
func (f *quotaFiller) fill(ctx context.Context, t *testing.T, worker int) {
	payload := strings.Repeat("p", quotaPayload)
	for n := 0; ctx.Err() == nil; n++ {
		tgt := f.spare
		if n%2 == 0 {
			tgt = f.keeper
		}
		id := fmt.Sprintf("w%d-%d", worker, n)
		req := reserveRequest(authority.ObjectUserSpot, id, tgt, payload)
		ready := fmt.Sprintf("ready-%s-%s", id, payload[:quotaPayload-20])
		err := f.reserveCommit(ctx, req, ready)
		f.mu.Lock()
		f.writes++
		switch {
		case err == nil:
			if tgt == f.keeper {
				f.acked[objectKey(t, authority.ObjectUserSpot, id)] = ready
			}
		case errors.Is(err, authority.ErrOutcomeUnknown), errors.Is(err, authority.ErrUnavailable):
			f.typed++
		case ctx.Err() == nil:
			f.untyped = append(f.untyped, err)
		}
		stop := f.typed >= 40
		f.mu.Unlock()
		if stop {
			return
		}
	}
}

func (f *quotaFiller) reserveCommit(ctx context.Context, req authority.ReserveRequest, ready string) error {
	res, err := f.st.Reserve(ctx, req)
	if err != nil {
		return err
	}
	if res.Kind != authority.KindReserved {
		return fmt.Errorf("reserve: %s", res.Kind)
	}
	r := reservation{req: req, id: res.ReservationID, row: res.Creating}
	com, err := f.st.Commit(ctx, r.commit(ready))
	if err != nil {
		return err
	}
	if com.Kind != authority.KindCommitted {
		return fmt.Errorf("commit: %s", com.Kind)
	}
	return nil
}

// quotaAlarmed reports whether the server has raised NOSPACE.
func quotaAlarmed(ctx context.Context, t *testing.T, cli *clientv3.Client) []*etcdserverpb.AlarmMember {
	t.Helper()
	resp, err := cli.AlarmList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return resp.Alarms
}

// quotaDBSize returns the server's database size.
func quotaDBSize(ctx context.Context, t *testing.T, cli *clientv3.Client, endpoint string) int64 {
	t.Helper()
	st, err := cli.Status(ctx, endpoint)
	if err != nil {
		t.Fatal(err)
	}
	return st.DbSize
}

func TestQuotaExhaustedFreesSpaceAndRecovers(t *testing.T) {
	etcdtest.SkipIfExternal(t, "the test runs its own server with a tiny space quota")
	srv := etcdtest.Start(t, etcdtest.WithQuotaBackendBytes(quotaBytes))
	cli := srv.Client(t)
	st := newStore(t, cli, "")
	ctx := settle(t)
	keeper := authority.OwnerToken{OwnerID: "keeper", LeaseGeneration: 1}
	spare := authority.OwnerToken{OwnerID: "spare", LeaseGeneration: 1}
	f := &quotaFiller{st: st, acked: map[authority.Key]string{},
		keeper: conformance.Target(conformance.NodeA, conformance.NodeLifecycle, keeper),
		spare:  conformance.Target(conformance.NodeA, conformance.NodeLifecycle, spare)}
	markLive(t, st, f.keeper, ownerTTL)
	markLive(t, st, f.spare, ownerTTL)

	fctx, stop := context.WithTimeout(ctx, 40*time.Second)
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Add(1)
		go func() { defer wg.Done(); f.fill(fctx, t, w) }()
	}
	wg.Wait()
	stop()
	if len(f.untyped) > 0 {
		t.Fatalf("%d writes failed with an untyped error, first: %v", len(f.untyped), f.untyped[0])
	}
	if len(quotaAlarmed(ctx, t, cli)) == 0 {
		t.Fatalf("no NOSPACE alarm after %d writes (%d refused)", f.writes, f.typed)
	}

	// reads work under the alarm, and nothing acknowledged is lost
	lost := quotaLost(t, st, f.acked)

	// freeing space works under the alarm: removal and pruning only delete
	removed, err := st.RemoveAllByOwner(ctx, spare)
	if err != nil || removed == 0 {
		t.Fatalf("remove the spare owner's rows under NOSPACE: %d, %v", removed, err)
	}
	if _, err := st.PruneCapacityEpochs(ctx); err != nil {
		t.Fatalf("prune capacity epochs under NOSPACE: %v", err)
	}

	// compact, defragment, disarm: the same store writes again
	before := quotaDBSize(ctx, t, cli, srv.Endpoint())
	freed := quotaRecover(ctx, t, cli, srv.Endpoint()) - before
	freed = -freed
	recovered := quotaWritesAgain(t, st, f.keeper)
	lost += quotaLost(t, st, f.acked)
	t.Logf("quota: writes=%d acked=%d acked-lost=%d typed-errors=%d removed-rows=%d freed-bytes=%d recovered=%t",
		f.writes, len(f.acked), lost, f.typed, removed, freed, recovered)
	if lost != 0 || !recovered || freed <= 0 {
		t.Fatalf("acked-lost=%d recovered=%t freed-bytes=%d", lost, recovered, freed)
	}
}

// quotaLost counts acknowledged keeper rows that are missing or changed.
func quotaLost(t *testing.T, st *etcdstore.Store, acked map[authority.Key]string) int {
	t.Helper()
	lost := 0
	for key, ready := range acked {
		r := mustRead(t, st, key)
		if r.Kind != authority.KindSnapshot || string(r.Snapshot.Payload) != ready {
			lost++
		}
	}
	return lost
}

// quotaRecover compacts at the current revision, defragments and disarms
// NOSPACE (the operator's procedure), returning the database size after.
func quotaRecover(ctx context.Context, t *testing.T, cli *clientv3.Client, endpoint string) int64 {
	t.Helper()
	cur, err := cli.Get(ctx, "compact-probe")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctx, cur.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatalf("compact: %v", err)
	}
	if _, err := cli.Defragment(ctx, endpoint); err != nil {
		t.Fatalf("defragment: %v", err)
	}
	for _, a := range quotaAlarmed(ctx, t, cli) {
		if _, err := cli.AlarmDisarm(ctx, &clientv3.AlarmMember{MemberID: a.MemberID, Alarm: a.Alarm}); err != nil {
			t.Fatalf("disarm: %v", err)
		}
	}
	if a := quotaAlarmed(ctx, t, cli); len(a) != 0 {
		t.Fatalf("alarms after disarm: %v", a)
	}
	return quotaDBSize(ctx, t, cli, endpoint)
}

// quotaWritesAgain reports whether the store, not restarted, reserves and
// commits a row after the recovery.
func quotaWritesAgain(t *testing.T, st *etcdstore.Store, tgt authority.CreationTarget) bool {
	t.Helper()
	req := reserveRequest(authority.ObjectUserSpot, "after-recovery", tgt, "small")
	var err error
	for deadline := time.Now().Add(settleTimeout); time.Now().Before(deadline); time.Sleep(retryPause) {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		err = (&quotaFiller{st: st}).reserveCommit(ctx, req, "ready")
		cancel()
		if err == nil {
			return true
		}
		if !transient(err) && !errors.Is(err, rpctypes.ErrNoSpace) {
			break
		}
	}
	t.Logf("write after recovery: %v", err)
	return false
}
