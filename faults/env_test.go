package faults_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdcluster"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
)

// Timeouts. Every etcd call carries a deadline: the store's RequestTimeout
// and the operation contexts below.
const (
	// requestTimeout bounds each etcd request a store sends.
	requestTimeout = 2 * time.Second
	// opTimeout bounds one store operation of a workload.
	opTimeout = 1500 * time.Millisecond
	// settleTimeout bounds waiting for the cluster to heal, a lease to
	// expire, or an operation to get through eventually.
	settleTimeout = 45 * time.Second
	// retryPause is the pause between retries of an operation that failed
	// because of a fault.
	retryPause = 50 * time.Millisecond
)

// ownerTTL is the lease TTL of owners that must stay live for a whole test.
const ownerTTL = 10 * time.Minute

var nsSeq atomic.Int64

// newStore returns an etcd store on cli in namespace ns (a fresh one when
// empty), closed at t's cleanup.
func newStore(t testing.TB, cli *clientv3.Client, ns string) *etcdstore.Store {
	t.Helper()
	if ns == "" {
		ns = fmt.Sprintf("/faults/%d/", nsSeq.Add(1))
	}
	ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
	defer cancel()
	s, err := etcdstore.New(ctx, etcdstore.Config{Client: cli, Namespace: ns, RequestTimeout: requestTimeout, SkipVersionCheck: true})
	if err != nil {
		t.Fatalf("new store: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// startCluster starts a 3-member cluster and returns it with a client of
// every member.
func startCluster(t testing.TB, opts etcdcluster.Options) (*etcdcluster.Cluster, *clientv3.Client) {
	t.Helper()
	c := etcdcluster.Start(t, opts)
	return c, c.Client(t)
}

// clientOf returns a client of the given members only (through their
// proxies), closed at t's cleanup. The client balances round robin over its
// endpoints and has no keep-alive: a client that includes a blackholed
// member sends every third request into the blackhole.
func clientOf(t testing.TB, c *etcdcluster.Cluster, members ...int) *clientv3.Client {
	t.Helper()
	eps := make([]string, len(members))
	for i, m := range members {
		eps[i] = c.Endpoint(m)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// settle returns a context for waiting on the cluster.
func settle(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
	t.Cleanup(cancel)
	return ctx
}

// transient reports whether err came from a fault (the store was unreachable
// or the outcome is unknown), so the operation may be retried.
func transient(err error) bool {
	return errors.Is(err, authority.ErrUnavailable) || errors.Is(err, authority.ErrOutcomeUnknown)
}

// notApplied reports whether a write that failed with err certainly did not
// take effect: the provider reports a write it may have applied as
// ErrOutcomeUnknown and keeps ErrUnavailable for refusals made before the
// request was processed (no leader, too many requests, a failed dial, a lost
// lease, a write not sent because its caller gave up while it was queued).
// Counting those as not applied makes the linearizability check verify that
// claim. Bad input, limits, a closed store and credentials are refusals too.
func notApplied(err error) bool {
	if errors.Is(err, authority.ErrOutcomeUnknown) {
		return false
	}
	for _, sentinel := range []error{
		authority.ErrUnavailable, authority.ErrInvalidArgument, authority.ErrLimitExceeded, authority.ErrClosed, authority.ErrAccessDenied,
		rpctypes.ErrNoLeader, rpctypes.ErrGRPCNoLeader, rpctypes.ErrTooManyRequests, rpctypes.ErrGRPCRequestTooManyRequests,
		rpctypes.ErrNotCapable, rpctypes.ErrGRPCNotCapable,
	} {
		if errors.Is(err, sentinel) {
			return true
		}
	}
	return false
}

// eventually retries fn with a fresh operation context until it returns
// nil or a non-transient error, or the settle timeout passes.
func eventually(t testing.TB, what string, fn func(ctx context.Context) error) {
	t.Helper()
	deadline := time.Now().Add(settleTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		err := fn(ctx)
		cancel()
		if err == nil {
			return
		}
		if !transient(err) || time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(retryPause)
	}
}

// objectKey encodes kind/id.
func objectKey(t testing.TB, kind authority.ObjectKind, id string) authority.Key {
	t.Helper()
	k, err := authority.EncodeKey(kind, id)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// reserveRequest returns a valid reserve request of kind/id on tgt with the
// creating payload.
func reserveRequest(kind authority.ObjectKind, id string, tgt authority.CreationTarget, payload string) authority.ReserveRequest {
	ref := "content-" + id
	sum := sha256.Sum256([]byte(ref))
	return authority.ReserveRequest{
		Key: authority.ObjectKey{Kind: kind, GlobalID: id},
		Intent: authority.CreationIntent{
			StableType:              conformance.DefaultStableType,
			RequestContentReference: ref,
			RequestSHA256:           sum[:],
			RequestEncodedSize:      int64(len(ref)),
		},
		Target:          tgt,
		CreatingPayload: []byte(payload),
		Capacity:        conformance.Capacity(kind, conformance.DefaultStableType),
	}
}

// reservation is a successful reserve.
type reservation struct {
	req authority.ReserveRequest
	id  string
	row *authority.Snapshot
}

func (r reservation) commit(ready string) authority.CommitRequest {
	return authority.CommitRequest{Key: r.req.Key, ReservationID: r.id, ExpectedStoreVersion: r.row.StoreVersion,
		Target: r.req.Target, ReadyPayload: []byte(ready)}
}

func (r reservation) abort() authority.AbortRequest {
	return authority.AbortRequest{Key: r.req.Key, ReservationID: r.id, ExpectedStoreVersion: r.row.StoreVersion, Target: r.req.Target}
}

func (r reservation) complete(ready string, pub *authority.TerminalPublication) authority.CompleteCreationRequest {
	return authority.CompleteCreationRequest{Key: r.req.Key, ReservationID: r.id, ExpectedStoreVersion: r.row.StoreVersion,
		Target: r.req.Target, Completion: authority.Completion{Kind: authority.TerminalCreated, ReadyPayload: []byte(ready), Terminal: pub}}
}

// publication returns a valid terminal publication of operation n with a
// deadline a minute from now.
func publication(n uint64) *authority.TerminalPublication {
	env := []byte(fmt.Sprintf("terminal-envelope-%d", n))
	sum := sha256.Sum256(env)
	return &authority.TerminalPublication{
		Operation:              authority.CreationOperation{SourceNodeRID: "faults-source", SourceNodeGeneration: 1, OperationID: authority.CreationOperationID{High: 0xfa, Low: n}},
		TerminalEnvelope:       env,
		TerminalEnvelopeSHA256: sum[:],
		OperationDeadline:      time.Now().Add(time.Minute).Truncate(time.Millisecond),
	}
}

// mustReserve reserves req (retrying faults; a retried reserve that finds its
// own reservation takes it) and requires KindReserved.
func mustReserve(t testing.TB, st *etcdstore.Store, req authority.ReserveRequest) reservation {
	t.Helper()
	var out reservation
	eventually(t, "reserve", func(ctx context.Context) error {
		res, err := st.Reserve(ctx, req)
		if err != nil {
			return err
		}
		switch {
		case res.Kind == authority.KindReserved:
			out = reservation{req: req, id: res.ReservationID, row: res.Creating}
			return nil
		case res.Kind == authority.KindConflict && res.Current.Snapshot != nil &&
			string(res.Current.Snapshot.Payload) == string(req.CreatingPayload) && res.Current.Snapshot.PendingCreation != nil:
			// an earlier attempt of unknown outcome applied
			out = reservation{req: req, id: res.Current.Snapshot.PendingCreation.ReservationID, row: res.Current.Snapshot}
			return nil
		}
		t.Fatalf("reserve %v: %s (current %+v)", req.Key, res.Kind, res.Current)
		return nil
	})
	return out
}

// mustCommit commits r (retrying faults) and returns the active row.
func mustCommit(t testing.TB, st *etcdstore.Store, r reservation, ready string) *authority.Snapshot {
	t.Helper()
	var out *authority.Snapshot
	eventually(t, "commit", func(ctx context.Context) error {
		res, err := st.Commit(ctx, r.commit(ready))
		if err != nil {
			return err
		}
		if res.Kind != authority.KindCommitted && res.Kind != authority.KindAlreadyCommitted {
			t.Fatalf("commit %v: %s", r.req.Key, res.Kind)
		}
		out = res.Ready
		return nil
	})
	return out
}

// mustRead reads key (retrying faults).
func mustRead(t testing.TB, st *etcdstore.Store, key authority.Key) authority.ReadResult {
	t.Helper()
	var out authority.ReadResult
	eventually(t, "read", func(ctx context.Context) error {
		var err error
		out, err = st.ReadAuthority(ctx, key)
		return err
	})
	return out
}

// listAll lists every row under prefix as one consistent snapshot (one page).
func listAll(t testing.TB, st *etcdstore.Store, prefix string) map[authority.Key]*authority.Snapshot {
	t.Helper()
	rows := map[authority.Key]*authority.Snapshot{}
	eventually(t, "list", func(ctx context.Context) error {
		page, err := st.ListAuthorities(ctx, prefix, "", authority.MaxScanLimit)
		if err != nil {
			return err
		}
		if page.Kind != authority.KindPage || page.NextCursor != "" {
			t.Fatalf("list %q: %s, more=%v", prefix, page.Kind, page.NextCursor != "")
		}
		clear(rows)
		for _, it := range page.Items {
			rows[it.Key] = it.Snapshot
		}
		return nil
	})
	return rows
}

// markLive makes owner live on node for ttl through st.
func markLive(t testing.TB, st *etcdstore.Store, tgt authority.CreationTarget, ttl time.Duration) {
	t.Helper()
	eventually(t, "mark live", func(ctx context.Context) error {
		return st.MarkLive(ctx, tgt.Descriptor(), tgt.NodeLifecycleGeneration, tgt.Owner, ttl)
	})
}

// waitHealthy waits until every running member serves.
func waitHealthy(t testing.TB, c *etcdcluster.Cluster) {
	t.Helper()
	if err := c.WaitHealthy(settle(t)); err != nil {
		t.Fatal(err)
	}
}
