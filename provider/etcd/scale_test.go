package etcd_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/embedded"
	"github.com/zlink-systems/authority/internal/etcdpage"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/preflight"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/etcd/storeversion"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// TestScale measures what one etcd holds and what each operation costs as
// the store grows (issue 27; docs/scale.md holds the figures of one run).
// It takes minutes, so it runs only with AUTHORITY_SCALE=1:
//
//	AUTHORITY_SCALE=1 go test -count=1 -timeout=2h -run TestScale -v ./provider/etcd/
//
// AUTHORITY_SCALE_ROWS sets the sizes (default 10000,100000) and
// AUTHORITY_SCALE_OWNERS the regular owners and nodes (default 100: fewer
// make each node's capacity range as long as at a larger size). Each size is
// filled through the store on an embedded etcd with fsync off, then the
// server restarts on the same data with fsync on and every phase is timed.
func TestScale(t *testing.T) {
	if os.Getenv("AUTHORITY_SCALE") != "1" {
		t.Skip("set AUTHORITY_SCALE=1 to run the scale measurements (minutes)")
	}
	sizes := []int{10_000, 100_000}
	if v := os.Getenv("AUTHORITY_SCALE_ROWS"); v != "" {
		sizes = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 2000 {
				t.Fatalf("AUTHORITY_SCALE_ROWS: %q is not a size >= 2000", f)
			}
			sizes = append(sizes, n)
		}
	}
	if v := os.Getenv("AUTHORITY_SCALE_OWNERS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			t.Fatalf("AUTHORITY_SCALE_OWNERS: %q is not a count in [1, 1000]", v)
		}
		scaleOwners = n
	}
	for _, n := range sizes {
		t.Run(strconv.Itoa(n), func(t *testing.T) { scaleRun(t, n) })
	}
}

// The fill's shape: scaleOwners owners on as many nodes hold the regular
// rows; the owner "big" holds n/10 rows on its own node (rebound, resynced
// and removed as a whole), the owner "rm" holds scaleRemoveSmall rows.
// scaleOwners is the number of regular owners (AUTHORITY_SCALE_OWNERS).
var scaleOwners = 100

const (
	scaleRemoveSmall = 1000
	scaleClients     = 64
	scalePairs       = 2000
	scaleEpochs      = 10_000
	scaleNS          = "/scale/"
)

var scalePolicy = conformance.CapacityPolicyFunc(func(authority.NodeDescriptor, authority.CapacityVector, authority.CapacityVector, authority.CapacityVector) bool {
	return true
})

func scaleTarget(owner string, gen int64) authority.CreationTarget {
	return authority.CreationTarget{MeshName: "mesh", NodeRID: "node-" + owner, NodeLifecycleGeneration: 1,
		Owner: authority.OwnerToken{OwnerID: owner, LeaseGeneration: gen}}
}

// scalePayload is row i's payload: 5% 16 KiB, 20% 1 KiB, the rest 64 B.
func scalePayload(i int) []byte {
	switch {
	case i%20 == 0:
		return make([]byte, 16*1024)
	case i%5 == 0:
		return make([]byte, 1024)
	default:
		return make([]byte, 64)
	}
}

// scaleReserveCommit creates row id (a Spot or an Actor by i) on target.
func scaleReserveCommit(ctx context.Context, s *etcdstore.Store, i int, id string, target authority.CreationTarget) (*authority.Snapshot, error) {
	kind, capacity := authority.ObjectUserSpot, conformance.Capacity(authority.ObjectUserSpot, conformance.DefaultStableType)
	if i%2 == 1 {
		kind, capacity = authority.ObjectActor, conformance.Capacity(authority.ObjectActor, conformance.DefaultStableType)
	}
	sum := sha256.Sum256([]byte(id))
	payload := scalePayload(i)
	key := authority.ObjectKey{Kind: kind, GlobalID: id}
	res, err := s.Reserve(ctx, authority.ReserveRequest{Key: key, Intent: authority.CreationIntent{
		StableType: conformance.DefaultStableType, RequestContentReference: "content-" + id,
		RequestSHA256: sum[:], RequestEncodedSize: int64(len(id))},
		Target: target, CreatingPayload: payload, Capacity: capacity})
	if err != nil {
		return nil, err
	}
	if res.Kind != authority.KindReserved {
		return nil, fmt.Errorf("reserve %s: %s", id, res.Kind)
	}
	if kind == authority.ObjectActor {
		return scaleCompleteActor(ctx, s, key, res, target, payload)
	}
	c, err := s.Commit(ctx, authority.CommitRequest{Key: key, ReservationID: res.ReservationID,
		ExpectedStoreVersion: res.Creating.StoreVersion, Target: target, ReadyPayload: payload})
	if err != nil {
		return nil, err
	}
	if c.Kind != authority.KindCommitted {
		return nil, fmt.Errorf("commit %s: %s", id, c.Kind)
	}
	return c.Ready, nil
}

// scaleOpSeq numbers the Actor creations' operation IDs.
var scaleOpSeq atomic.Uint64

// scaleCompleteActor completes an Actor's creation with its terminal.
func scaleCompleteActor(ctx context.Context, s *etcdstore.Store, key authority.ObjectKey, res authority.ReserveResult,
	target authority.CreationTarget, payload []byte) (*authority.Snapshot, error) {
	envelope := []byte("created " + key.GlobalID)
	sum := sha256.Sum256(envelope)
	done, err := s.CompleteCreation(ctx, authority.CompleteCreationRequest{
		Key: key, ReservationID: res.ReservationID, ExpectedStoreVersion: res.Creating.StoreVersion, Target: target,
		Completion: authority.Completion{Kind: authority.TerminalCreated, ReadyPayload: payload,
			Terminal: &authority.TerminalPublication{
				Operation: authority.CreationOperation{SourceNodeRID: target.NodeRID, SourceNodeGeneration: 1,
					OperationID: authority.CreationOperationID{High: 1, Low: scaleOpSeq.Add(1)}},
				TerminalEnvelope: envelope, TerminalEnvelopeSHA256: sum[:], OperationDeadline: time.Now().Add(time.Hour),
			}},
	})
	if err != nil {
		return nil, err
	}
	if done.Kind != authority.KindCreated {
		return nil, fmt.Errorf("complete %s: %s", key.GlobalID, done.Kind)
	}
	return done.Ready, nil
}

// parallel runs op(i) for i in [0, n) on workers goroutines.
func parallel(n, workers int, op func(i int) error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				if err := op(i); err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// scaleServer is the embedded etcd of one size, restartable on its data.
type scaleServer struct {
	t    *testing.T
	dir  string
	srv  *embedded.Server
	c    *clientv3.Client
	sent *atomic.Int64 // request bytes the client sent
}

func (ss *scaleServer) start(fsync bool) {
	t := ss.t
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := embedded.Start(ctx, embedded.Config{Dir: ss.dir, Fsync: fsync, MaxTxnOps: preflight.RecommendedMaxTxnOps,
		MaxRequestBytes: preflight.RecommendedMaxRequestBytes, QuotaBackendBytes: 8 << 30, AutoCompactionRetention: "1000h"})
	if err != nil {
		t.Fatal(err)
	}
	ss.srv = srv
	ss.sent = &atomic.Int64{}
	sent := ss.sent
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if m, ok := req.(proto.Message); ok {
			sent.Add(int64(proto.Size(m)))
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	ss.c, err = clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint()}, DialTimeout: 10 * time.Second, Logger: zap.NewNop(),
		MaxCallRecvMsgSize: 256 << 20, MaxCallSendMsgSize: preflight.RecommendedMaxRequestBytes + 1<<20, DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(count)}})
	if err != nil {
		t.Fatal(err)
	}
}

func (ss *scaleServer) stop() {
	_ = ss.c.Close()
	ss.srv.Close()
}

func (ss *scaleServer) store() *etcdstore.Store {
	// AUTHORITY_SCALE_VERSION: the namespace's active version (default: a new
	// namespace's, Latest), to measure a format next to another
	if v := os.Getenv("AUTHORITY_SCALE_VERSION"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || !storeversion.Known(storeversion.Version(n)) {
			ss.t.Fatalf("AUTHORITY_SCALE_VERSION: %q is not a version this build knows", v)
		}
		key := schema.NewLayout(scaleNS).ActiveVersion()
		if _, err := ss.c.Txn(context.Background()).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, schema.EncodeActiveVersion(storeversion.Version(n)))).Commit(); err != nil {
			ss.t.Fatal(err)
		}
	}
	// the store's limits are the server's, as the README configures them
	s, err := etcdstore.New(context.Background(), etcdstore.Config{Client: ss.c, Namespace: scaleNS,
		MaxTxnOps: preflight.RecommendedMaxTxnOps, MaxRequestBytes: preflight.RecommendedMaxRequestBytes})
	if err != nil {
		ss.t.Fatal(err)
	}
	s.SetCapacityPolicy(scalePolicy)
	return s
}

// figure logs one measured figure in a form docs/scale.md quotes.
func figure(t *testing.T, n int, name string, format string, args ...any) {
	t.Logf("SCALE rows=%d %-34s %s", n, name, fmt.Sprintf(format, args...))
}

func scaleRun(t *testing.T, n int) {
	ss := &scaleServer{t: t, dir: t.TempDir()}
	ss.start(false)
	big := n / 10
	regular := n - big - scaleRemoveSmall
	fillStart := time.Now()
	scaleFill(t, ss, regular, big)
	fill := time.Since(fillStart)
	figure(t, n, "fill (fsync off, 64 clients)", "%s, %.0f rows/s", fill.Truncate(time.Second), float64(n)/fill.Seconds())
	scaleFootprint(t, ss, n)
	ss.stop()

	ss.start(true)
	defer ss.stop()
	scaleOps(t, ss, n, regular, big)
}

// scaleFill creates the rows through the store.
func scaleFill(t *testing.T, ss *scaleServer, regular, big int) {
	ctx := context.Background()
	s := ss.store()
	defer s.Close()
	for o := range scaleOwners {
		tg := scaleTarget("o"+strconv.Itoa(o), 1)
		if err := s.MarkLive(ctx, tg.Descriptor(), 1, tg.Owner, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	rm := scaleTarget("rm", 1)
	if err := s.MarkLive(ctx, rm.Descriptor(), 1, rm.Owner, time.Hour); err != nil {
		t.Fatal(err)
	}
	// big's first generation, through the registry: RebindRows moves its
	// rows to the next one
	lease, err := s.Registry().Acquire(ctx, scaleTarget("big", 1).Descriptor(), 1, "big", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Close(ctx)
	if lease.Token().LeaseGeneration != 1 {
		t.Fatalf("big's first generation is %d", lease.Token().LeaseGeneration)
	}
	err = parallel(regular+big+scaleRemoveSmall, scaleClients, func(i int) error {
		var tg authority.CreationTarget
		switch {
		case i < regular:
			tg = scaleTarget("o"+strconv.Itoa(i%scaleOwners), 1)
		case i < regular+big:
			tg = scaleTarget("big", 1)
		default:
			tg = scaleTarget("rm", 1)
		}
		_, err := scaleReserveCommit(ctx, s, i, fmt.Sprintf("r%08d", i), tg)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// scaleFootprint reports keys per row and bytes per row before and after
// compaction + defrag.
func scaleFootprint(t *testing.T, ss *scaleServer, n int) {
	ctx := context.Background()
	c := ss.c
	all, err := c.Get(ctx, scaleNS, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	av, err := c.Get(ctx, schema.NewLayout(scaleNS).ActiveVersion())
	if err != nil {
		t.Fatal(err)
	}
	var active *mvccpb.KeyValue
	if len(av.Kvs) > 0 {
		active = av.Kvs[0]
	}
	v, err := schema.DecodeActiveVersion(active)
	if err != nil {
		t.Fatal(err)
	}
	figure(t, n, "store version", "%s", v)
	figure(t, n, "keys per row", "%.3f (%d keys)", float64(all.Count)/float64(n), all.Count)
	expiring := int64(0) // terminals: they expire (the creation terminals at their operation's deadline)
	for k := schema.EntryRow; k <= schema.EntryOwnerNode; k++ {
		keys, bytes := scaleSegment(t, c, schema.Prefix(scaleNS, k))
		if keys > 0 && k != schema.EntryStoreVersion {
			figure(t, n, "segment "+strings.TrimPrefix(schema.Prefix(scaleNS, k), scaleNS), "%d keys, %.1f B key+value per row", keys, float64(bytes)/float64(n))
		}
		if k == schema.EntryReservation || k == schema.EntryTerminal {
			expiring += keys
		}
	}
	figure(t, n, "keys per row once terminals expire", "%.3f", float64(all.Count-expiring)/float64(n))
	before, err := c.Status(ctx, ss.srv.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Compact(ctx, all.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Defragment(ctx, ss.srv.Endpoint()); err != nil {
		t.Fatal(err)
	}
	after, err := c.Status(ctx, ss.srv.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	perRow := float64(after.DbSizeInUse) / float64(n)
	figure(t, n, "db before compaction", "size %d B, in use %d B (%.0f B/row), revision %d", before.DbSize, before.DbSizeInUse, float64(before.DbSizeInUse)/float64(n), all.Header.Revision)
	figure(t, n, "db after compaction+defrag", "size %d B, in use %d B", after.DbSize, after.DbSizeInUse)
	figure(t, n, "bytes per row (compacted)", "%.0f B; rows per GiB %.0f; rows at 8 GiB %.0f", perRow, float64(1<<30)/perRow, float64(8<<30)/perRow)
}

// scaleSegment counts the keys under prefix and their key+value bytes,
// in pages.
func scaleSegment(t *testing.T, c *clientv3.Client, prefix string) (keys, bytes int64) {
	end := clientv3.GetPrefixRangeEnd(prefix)
	for from := prefix; ; {
		resp, err := c.Get(context.Background(), from, clientv3.WithRange(end), clientv3.WithLimit(5000))
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range resp.Kvs {
			keys++
			bytes += int64(len(kv.Key) + len(kv.Value))
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return keys, bytes
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// timed runs f and returns how long it took.
func timed(t *testing.T, f func() error) time.Duration {
	t.Helper()
	start := time.Now()
	if err := f(); err != nil {
		t.Fatal(err)
	}
	return time.Since(start)
}

// scaleOps times every operation with fsync on.
func scaleOps(t *testing.T, ss *scaleServer, n, regular, big int) {
	ctx := context.Background()
	s := ss.store()
	defer s.Close()
	for o := range scaleOwners {
		tg := scaleTarget("o"+strconv.Itoa(o), 1)
		if err := s.MarkLive(ctx, tg.Descriptor(), 1, tg.Owner, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	rm := scaleTarget("rm", 1)
	if err := s.MarkLive(ctx, rm.Descriptor(), 1, rm.Owner, time.Hour); err != nil {
		t.Fatal(err)
	}
	scaleWrites(t, ss, s, n)
	scaleLists(t, ss, s, n, regular, big)
	d := timed(t, func() error {
		removed, err := s.RemoveAllByOwner(ctx, rm.Owner)
		if err == nil && removed != scaleRemoveSmall {
			err = fmt.Errorf("removed %d rows, want %d", removed, scaleRemoveSmall)
		}
		return err
	})
	figure(t, n, "RemoveAllByOwner 1000 rows", "%s (%.0f rows/s)", d.Truncate(time.Millisecond), scaleRemoveSmall/d.Seconds())
	lease, err := s.Registry().Acquire(ctx, scaleTarget("big", 2).Descriptor(), 1, "big", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Close(ctx)
	d = timed(t, func() error {
		moved, err := lease.RebindRows(ctx, scaleTarget("big", 1).Owner)
		if err == nil && moved != int64(big) {
			err = fmt.Errorf("rebound %d rows, want %d", moved, big)
		}
		return err
	})
	figure(t, n, fmt.Sprintf("RebindRows %d rows", big), "%s (%.0f rows/s)", d.Truncate(time.Millisecond), float64(big)/d.Seconds())
	scaleUsage(t, ss, n, big)
	scalePrune(t, ss, s, n)
	d = timed(t, func() error {
		removed, err := s.RemoveAllByOwner(ctx, lease.Token())
		if err == nil && removed != int64(big) {
			err = fmt.Errorf("removed %d rows, want %d", removed, big)
		}
		return err
	})
	figure(t, n, fmt.Sprintf("RemoveAllByOwner %d rows", big), "%s (%.0f rows/s)", d.Truncate(time.Millisecond), float64(big)/d.Seconds())
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	figure(t, n, "process heap (etcd + store)", "%d MiB in use", ms.HeapInuse>>20)
}

// scaleWrites: reserve+commit pairs and CAS puts at 64 clients, with the
// bytes the client sent and the revisions each pair made.
func scaleWrites(t *testing.T, ss *scaleServer, s *etcdstore.Store, n int) {
	ctx := context.Background()
	value := string(make([]byte, 1200)) // a stored row's size with a 64 B payload
	d := timed(t, func() error {
		return parallel(scalePairs, scaleClients, func(i int) error {
			key := scaleNS + "raw/" + strconv.Itoa(i)
			resp, err := ss.c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", 0)).Then(clientv3.OpPut(key, value)).Commit()
			if err == nil && !resp.Succeeded {
				err = fmt.Errorf("raw txn on %s: compare failed", key)
			}
			return err
		})
	})
	figure(t, n, "raw etcd Txn baseline, 64 clients", "%.0f Txns/s", scalePairs/d.Seconds())
	// a store that has not decided on the nodes yet reads each node's
	// capacity range once (then watches it); a running store has watches
	cold := etcdstore.CapacityRangeReads(s)
	d = timed(t, func() error {
		return parallel(scalePairs, scaleClients, func(i int) error {
			_, err := scaleReserveCommit(ctx, s, 2, fmt.Sprintf("c%08d", i), scaleTarget("o"+strconv.Itoa(i%scaleOwners), 1))
			return err
		})
	})
	figure(t, n, "reserve+commit, nodes not watched", "%.0f pairs/s; %d capacity range reads (%d nodes)",
		scalePairs/d.Seconds(), etcdstore.CapacityRangeReads(s)-cold, scaleOwners)
	warm := etcdstore.CapacityRangeReads(s)
	rev0, _ := ss.c.Get(ctx, "x")
	sent0 := ss.sent.Load()
	watches0, _ := etcdstore.UsageWatchCounts(s)
	stopProfile := scaleProfile(t, n, "reserve-commit")
	d = timed(t, func() error {
		return parallel(scalePairs, scaleClients, func(i int) error {
			_, err := scaleReserveCommit(ctx, s, 2, fmt.Sprintf("w%08d", i), scaleTarget("o"+strconv.Itoa(i%scaleOwners), 1))
			return err
		})
	})
	stopProfile()
	rev1, _ := ss.c.Get(ctx, "x")
	watches1, _ := etcdstore.UsageWatchCounts(s)
	figure(t, n, "capacity range reads (watched)", "%d", etcdstore.CapacityRangeReads(s)-warm)
	figure(t, n, "reserve+commit Spot, 64 clients", "%.0f pairs/s; %.0f request B/pair (64 B payload); %.2f revisions/pair; %d usage watch restarts (a decision that read its node's whole range)",
		scalePairs/d.Seconds(), float64(ss.sent.Load()-sent0)/scalePairs, float64(rev1.Header.Revision-rev0.Header.Revision)/scalePairs, watches1-watches0)
	keys := make([]authority.Key, scaleClients)
	versions := make([]authority.StoreVersion, scaleClients)
	for i := range scaleClients {
		k, err := authority.EncodeKey(authority.ObjectUserSpot, fmt.Sprintf("w%08d", i))
		if err != nil {
			t.Fatal(err)
		}
		r, err := s.ReadAuthority(ctx, k)
		if err != nil || r.Kind != authority.KindSnapshot {
			t.Fatalf("read %s: %v %v", k, r.Kind, err)
		}
		keys[i], versions[i] = k, r.Snapshot.StoreVersion
	}
	payload := make([]byte, 64)
	var done atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, scaleClients)
	start := time.Now()
	for c := range scaleClients {
		wg.Go(func() {
			for done.Add(1) <= scalePairs {
				res, err := s.CompareExchangeAuthority(ctx, keys[c], versions[c], authority.Put(payload))
				if err == nil && res.Kind != authority.KindStored {
					err = fmt.Errorf("cas: %s", res.Kind)
				}
				if err != nil {
					errs[c] = err
					return
				}
				versions[c] = res.Snapshot.StoreVersion
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	figure(t, n, "CAS, 64 clients", "%.0f ops/s", scalePairs/time.Since(start).Seconds())
}

// scaleLists: one 1000-row page (the mean of 5 from different places) and
// a listing of every row.
func scaleLists(t *testing.T, ss *scaleServer, s *etcdstore.Store, n, regular, big int) {
	ctx := context.Background()
	// the same first page as one ranged Get, which etcd answers after
	// counting every row after the page (what a page cost before streaming)
	first := schema.Prefix(scaleNS, schema.EntryRow) + authority.KindPrefix(authority.ObjectUserSpot)
	var counted time.Duration
	for range 5 {
		t0 := time.Now()
		p, err := etcdpage.Read(ctx, ss.c.KV, first, clientv3.GetPrefixRangeEnd(first), 0, authority.MaxScanLimit)
		if err != nil || len(p.Kvs) != authority.MaxScanLimit {
			t.Fatalf("ranged page: %d rows, %v", len(p.Kvs), err)
		}
		counted += time.Since(t0)
	}
	figure(t, n, "1000-row ranged Get (counted)", "%s", (counted / 5).Truncate(10*time.Microsecond))
	var pages time.Duration
	var cursor authority.ScanCursor
	total := 0
	listStart := time.Now()
	for _, kind := range []authority.ObjectKind{authority.ObjectUserSpot, authority.ObjectActor} {
		cursor = ""
		for page := 0; ; page++ {
			t0 := time.Now()
			res, err := s.ListAuthorities(ctx, authority.KindPrefix(kind), cursor, authority.MaxScanLimit)
			if err != nil {
				t.Fatal(err)
			}
			if page < 5 && kind == authority.ObjectUserSpot {
				pages += time.Since(t0)
			}
			total += len(res.Items)
			if cursor = res.NextCursor; cursor == "" {
				break
			}
		}
	}
	list := time.Since(listStart)
	if want := n + 2*scalePairs; total != want {
		t.Fatalf("listed %d rows, want %d", total, want)
	}
	figure(t, n, "1000-row page", "%s", (pages / 5).Truncate(10*time.Microsecond))
	figure(t, n, "list every row", "%s (%.0f rows/s)", list.Truncate(time.Millisecond), float64(total)/list.Seconds())
}

// scaleUsage: a new store's first usage read of big's node (a resync of
// its capacity range, big entries) and the heap it keeps for it.
func scaleUsage(t *testing.T, ss *scaleServer, n, big int) {
	ctx := context.Background()
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	s := ss.store()
	defer s.Close()
	node := scaleTarget("big", 2).Descriptor()
	var u authority.CapacityUsage
	d := timed(t, func() error {
		var err error
		u, err = s.CapacityUsage(ctx, node, 1, authority.ObjectActor, conformance.DefaultStableType)
		return err
	})
	runtime.GC()
	runtime.ReadMemStats(&m1)
	figure(t, n, fmt.Sprintf("usage resync %d entries", big), "%s; usage %+v; store heap after %+d KiB",
		d.Truncate(time.Millisecond), u, (int64(m1.HeapAlloc)-int64(m0.HeapAlloc))>>10)
}

// scalePrune: PruneCapacityEpochs of scaleEpochs empty epochs (copies of a
// real epoch key under lifecycles of a node with no capacity).
func scalePrune(t *testing.T, ss *scaleServer, s *etcdstore.Store, n int) {
	ctx := context.Background()
	prefix := schema.Prefix(scaleNS, schema.EntryCapacityEpoch)
	one, err := ss.c.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithLimit(1))
	if err != nil || len(one.Kvs) != 1 {
		t.Fatalf("no epoch to copy: %v", err)
	}
	value := string(one.Kvs[0].Value)
	for from := 0; from < scaleEpochs; from += 100 {
		ops := make([]clientv3.Op, 0, 100)
		for l := from; l < from+100; l++ {
			ops = append(ops, clientv3.OpPut(prefix+"mesh/ghost/"+strconv.Itoa(l+1), value))
		}
		if _, err := ss.c.Txn(ctx).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
	}
	var pruned int
	d := timed(t, func() error {
		var err error
		pruned, err = s.PruneCapacityEpochs(ctx)
		return err
	})
	if pruned < scaleEpochs {
		t.Fatalf("pruned %d epochs, want at least %d", pruned, scaleEpochs)
	}
	figure(t, n, "prune 10k empty epochs", "%s (%d pruned)", d.Truncate(time.Millisecond), pruned)
}

// scaleProfile starts a CPU profile of one phase (the store and the
// embedded etcd server, one process) when AUTHORITY_SCALE_PROFILE names a
// directory, and returns what stops it.
func scaleProfile(t *testing.T, n int, phase string) func() {
	dir := os.Getenv("AUTHORITY_SCALE_PROFILE")
	if dir == "" {
		return func() {}
	}
	f, err := os.Create(filepath.Join(dir, fmt.Sprintf("%s-%d.pprof", phase, n)))
	if err != nil {
		t.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		t.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}
}
