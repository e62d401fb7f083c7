package etcd_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/etcd/storeversion"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The benchmarks of issue 7, on an embedded etcd with fsync on (started by
// each top-level benchmark; TestMain's server runs without fsync). Each
// reports ops/s (one op = one logical operation) and the p50/p99 latency of
// one op. Run:
//
//	go test -run='^$' -bench='BenchmarkEtcd|BenchmarkRawEtcd' -benchtime=2000x ./provider/etcd/

// benchClients are the client counts of every workload.
var benchClients = []int{1, 64}

// benchPayload is the payload of every row the benchmarks write.
var benchPayload = make([]byte, 16)

// BenchmarkEtcd measures the store's operations.
func BenchmarkEtcd(b *testing.B) {
	srv := etcdtest.Start(b, etcdtest.WithFsync(true))
	c := srv.Client(b)
	workloads := []struct {
		name string
		run  func(b *testing.B, c *clientv3.Client, clients int)
	}{
		{"cas", benchCAS},
		{"reserve-commit", benchReserveCommit},
		{"aggregate16", benchAggregate16},
		{"reserve-one-node", func(b *testing.B, c *clientv3.Client, clients int) { benchReserveNodes(b, c, clients, 1) }},
		{"reserve-many-nodes", func(b *testing.B, c *clientv3.Client, clients int) { benchReserveNodes(b, c, clients, 64) }},
	}
	for _, w := range workloads {
		for _, n := range benchClients {
			b.Run(fmt.Sprintf("%s/clients=%d", w.name, n), func(b *testing.B) { w.run(b, c, n) })
		}
	}
	// last: its 100k rows would otherwise sit in the database of the others
	list := &listBench{}
	b.Cleanup(func() {
		if list.s != nil {
			_ = list.s.Close()
		}
	})
	b.Run("list/clients=1", func(b *testing.B) { list.run(b, c) })
}

// BenchmarkEtcdBatching measures reserve+commit pairs at 64 clients with
// write batching off (Config.MaxConcurrentTxns < 0: every write is a Txn of
// its own) and on (the default), back to back on one server: the figure
// behind "batching roughly doubles reserve+commit at 64 callers"
// (docs/performance.md).
func BenchmarkEtcdBatching(b *testing.B) {
	srv := etcdtest.Start(b, etcdtest.WithFsync(true))
	c := srv.Client(b)
	for _, mode := range []struct {
		name string
		max  int
	}{{"off", -1}, {"on", 0}} {
		b.Run(fmt.Sprintf("reserve-commit/batching=%s/clients=64", mode.name), func(b *testing.B) {
			benchReserveCommitWith(b, c, 64, func(cfg *etcdstore.Config) { cfg.MaxConcurrentTxns = mode.max })
		})
	}
}

// BenchmarkEtcdFormats measures reserve+commit pairs and CAS at 64 clients
// on a namespace at the version before storeversion.CompactFormat (format 1),
// at the one before storeversion.FewerKeys (the compact format, 4 keys a
// Spot) and at FewerKeys (2 keys a Spot), back to back on one server, each
// workload twice in alternation (old, new, newer, old, new, newer) so that a
// load change on the machine shows as a difference between the two runs of
// one format:
//
//	go test -run='^$' -bench=BenchmarkEtcdFormats -benchtime=3000x ./provider/etcd/
func BenchmarkEtcdFormats(b *testing.B) {
	srv := etcdtest.Start(b, etcdtest.WithFsync(true))
	c := srv.Client(b)
	at := func(v storeversion.Version) func(*etcdstore.Config) {
		return func(cfg *etcdstore.Config) {
			if _, err := c.Put(context.Background(), schema.NewLayout(cfg.Namespace).ActiveVersion(), schema.EncodeActiveVersion(v)); err != nil {
				b.Fatal(err)
			}
		}
	}
	for _, w := range []struct {
		name string
		run  func(*testing.B, *clientv3.Client, int, func(*etcdstore.Config))
	}{{"reserve-commit", benchReserveCommitWith}, {"cas", benchCASWith}} {
		for round := range 2 {
			for _, v := range []storeversion.Version{storeversion.CompactFormat - 1, storeversion.FewerKeys - 1, storeversion.FewerKeys} {
				b.Run(fmt.Sprintf("%s/version=%d/run=%d/clients=64", w.name, v, round+1), func(b *testing.B) { w.run(b, c, 64, at(v)) })
			}
		}
	}
}

// BenchmarkRawEtcd is the baseline: the plain client doing one Txn (one
// compare, one put of a row-sized value on a new key) per op.
func BenchmarkRawEtcd(b *testing.B) {
	srv := etcdtest.Start(b, etcdtest.WithFsync(true))
	c := srv.Client(b)
	value := string(make([]byte, rowValueSize(b, c)))
	for _, n := range benchClients {
		b.Run(fmt.Sprintf("txn/clients=%d", n), func(b *testing.B) {
			ns := etcdtest.Namespace()
			ctx := context.Background()
			measure(b, n, func(client, i int) error {
				key := ns + strconv.Itoa(client) + "/" + strconv.Itoa(i)
				resp, err := c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", 0)).
					Then(clientv3.OpPut(key, value)).Commit()
				if err == nil && !resp.Succeeded {
					err = errors.New("raw txn: compare failed")
				}
				return err
			})
			b.ReportMetric(float64(len(value)), "value-B")
		})
	}
	// not a target: the cost of the store's reserve+commit Txns to etcd alone
	for _, n := range benchClients {
		b.Run(fmt.Sprintf("reserve-commit-shaped/clients=%d", n), func(b *testing.B) { benchRawShapedPair(b, c, n, value) })
	}
}

// benchRawShapedPair: one op is the two Txns of a reservation and its
// commit, written by hand with the plain client (the same compares, keys and
// value sizes as the store's): what the pair costs etcd itself, without the
// adapter.
func benchRawShapedPair(b *testing.B, c *clientv3.Client, clients int, value string) {
	ctx := context.Background()
	ns := etcdtest.Namespace()
	live := ns + "owners/owner-a/1/mesh-1/node-a/1"
	lease, err := c.Grant(ctx, 3600)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := c.Put(ctx, live, "live", clientv3.WithLease(lease.ID)); err != nil {
		b.Fatal(err)
	}
	reservedCap := `{"st":"reserved","s":1,"k":"user_spot","t":"type-a","c":1,"x":true}`
	activeCap := `{"st":"active","s":1,"k":"user_spot","t":"type-a","c":1,"x":true}`
	terminal := `{"state":"committed","expiresAt":"2030-01-02T03:04:05Z"}`
	liveCmp := clientv3.Compare(clientv3.CreateRevision(live), ">", 0)
	measure(b, clients, func(client, i int) error {
		key := "user_spot/rc-" + strconv.Itoa(client) + "-" + strconv.Itoa(i)
		row := ns + "rows/" + key
		r1, err := c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(row), "=", 0), liveCmp).
			Then(clientv3.OpPut(row, value), clientv3.OpPut(ns+"capacity/mesh-1/node-a/1/row/"+key, reservedCap),
				clientv3.OpPut(ns+"owner-rows/owner-a/1/"+key, "")).
			Else(clientv3.OpGet(row), clientv3.OpGet(live)).Commit()
		if err != nil {
			return err
		}
		if !r1.Succeeded {
			return errors.New("shaped reserve: compare failed")
		}
		r2, err := c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(row), "=", r1.Header.Revision), liveCmp).
			Then(clientv3.OpPut(row, value), clientv3.OpPut(ns+"capacity/mesh-1/node-a/1/row/"+key, activeCap),
				clientv3.OpPut(ns+"reservations/"+strconv.Itoa(client)+"-"+strconv.Itoa(i), terminal, clientv3.WithLease(lease.ID))).
			Else(clientv3.OpGet(row), clientv3.OpGet(ns+"reservations/x")).Commit()
		if err != nil {
			return err
		}
		if !r2.Succeeded {
			return errors.New("shaped commit: compare failed")
		}
		return nil
	})
}

// measure runs b.N ops split across clients goroutines (op(client, i) is the
// client's i-th op) and reports ops/s and the latency percentiles.
func measure(b *testing.B, clients int, op func(client, i int) error) {
	b.Helper()
	lat := make([][]time.Duration, clients)
	errs := make([]error, clients)
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for c := range clients {
		n := b.N / clients
		if c < b.N%clients {
			n++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := make([]time.Duration, 0, n)
			for i := range n {
				t0 := time.Now()
				if err := op(c, i); err != nil {
					errs[c] = fmt.Errorf("client %d op %d: %w", c, i, err)
					return
				}
				l = append(l, time.Since(t0))
			}
			lat[c] = l
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if err := errors.Join(errs...); err != nil {
		b.Fatal(err)
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "ops/s")
	b.ReportMetric(percentile(all, 0.50), "p50-ms")
	b.ReportMetric(percentile(all, 0.99), "p99-ms")
}

func percentile(sorted []time.Duration, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := min(len(sorted)-1, int(q*float64(len(sorted))))
	return float64(sorted[i]) / float64(time.Millisecond)
}

// benchStore returns a store in a fresh namespace on c, closed at b's end,
// with owner i live on node i for i < nodes.
func benchStore(b *testing.B, c *clientv3.Client, nodes int) *etcdstore.Store {
	b.Helper()
	return benchStoreWith(b, c, nodes, nil)
}

// benchStoreWith is benchStore with edit (nil: none) applied to its Config.
func benchStoreWith(b *testing.B, c *clientv3.Client, nodes int, edit func(*etcdstore.Config)) *etcdstore.Store {
	b.Helper()
	ctx := context.Background()
	cfg := etcdstore.Config{Client: c, Namespace: etcdtest.Namespace()}
	benchObservability(&cfg)
	if edit != nil {
		edit(&cfg)
	}
	s, err := etcdstore.New(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	for i := range nodes {
		t := benchTarget(i)
		if err := s.MarkLive(ctx, t.Descriptor(), t.NodeLifecycleGeneration, t.Owner, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
	return s
}

// benchTarget is owner i on node i.
func benchTarget(i int) authority.CreationTarget {
	if i == 0 {
		return conformance.TargetA
	}
	return conformance.Target(authority.NodeDescriptor{MeshName: "mesh-1", RID: "node-" + strconv.Itoa(i)},
		conformance.NodeLifecycle, authority.OwnerToken{OwnerID: "owner-" + strconv.Itoa(i), LeaseGeneration: 1})
}

// reserveRequest is a valid reservation of kind/id on target.
func reserveRequest(kind authority.ObjectKind, id string, target authority.CreationTarget) authority.ReserveRequest {
	sum := sha256.Sum256([]byte(id))
	return authority.ReserveRequest{
		Key: authority.ObjectKey{Kind: kind, GlobalID: id},
		Intent: authority.CreationIntent{
			StableType: conformance.DefaultStableType, RequestContentReference: "content-" + id,
			RequestSHA256: sum[:], RequestEncodedSize: int64(len(id)),
		},
		Target:          target,
		CreatingPayload: benchPayload,
		Capacity:        conformance.Capacity(kind, conformance.DefaultStableType),
	}
}

// reserveCommit reserves and commits a Spot and returns its active row.
func reserveCommit(ctx context.Context, s *etcdstore.Store, id string) (*authority.Snapshot, error) {
	req := reserveRequest(authority.ObjectUserSpot, id, conformance.TargetA)
	res, err := s.Reserve(ctx, req)
	if err != nil {
		return nil, err
	}
	if res.Kind != authority.KindReserved {
		return nil, fmt.Errorf("reserve %s: %s", id, res.Kind)
	}
	c, err := s.Commit(ctx, authority.CommitRequest{
		Key: req.Key, ReservationID: res.ReservationID, ExpectedStoreVersion: res.Creating.StoreVersion,
		Target: req.Target, ReadyPayload: benchPayload,
	})
	if err != nil {
		return nil, err
	}
	if c.Kind != authority.KindCommitted {
		return nil, fmt.Errorf("commit %s: %s", id, c.Kind)
	}
	return c.Ready, nil
}

// rowValueSize is the stored size of an active Spot row with the
// benchmarks' payload.
func rowValueSize(b *testing.B, c *clientv3.Client) int {
	b.Helper()
	s := benchStore(b, c, 1)
	if _, err := reserveCommit(context.Background(), s, "size"); err != nil {
		b.Fatal(err)
	}
	resp, err := c.Get(context.Background(), s.Namespace()+"rows/"+string(spotKey(b, "size")))
	if err != nil || len(resp.Kvs) != 1 {
		b.Fatalf("read row: %v", err)
	}
	return len(resp.Kvs[0].Value)
}

func spotKey(b *testing.B, id string) authority.Key {
	k, err := authority.EncodeKey(authority.ObjectUserSpot, id)
	if err != nil {
		b.Fatal(err)
	}
	return k
}

// benchCAS: CAS puts, each client on its own active row.
func benchCAS(b *testing.B, c *clientv3.Client, clients int) { benchCASWith(b, c, clients, nil) }

// benchCASWith is benchCAS on a store whose Config edit changed.
func benchCASWith(b *testing.B, c *clientv3.Client, clients int, edit func(*etcdstore.Config)) {
	ctx := context.Background()
	s := benchStoreWith(b, c, 1, edit)
	keys := make([]authority.Key, clients)
	versions := make([]authority.StoreVersion, clients)
	for i := range clients {
		id := "cas-" + strconv.Itoa(i)
		row, err := reserveCommit(ctx, s, id)
		if err != nil {
			b.Fatal(err)
		}
		keys[i], versions[i] = spotKey(b, id), row.StoreVersion
	}
	m := authority.Put(benchPayload)
	defer reportBatching(b, s, s.WriteStats())
	measure(b, clients, func(client, _ int) error {
		res, err := s.CompareExchangeAuthority(ctx, keys[client], versions[client], m)
		if err != nil {
			return err
		}
		if res.Kind != authority.KindStored {
			return fmt.Errorf("cas: %s", res.Kind)
		}
		versions[client] = res.Snapshot.StoreVersion
		return nil
	})
}

// benchReserveCommit: one op is a reservation and its commit.
func benchReserveCommit(b *testing.B, c *clientv3.Client, clients int) {
	benchReserveCommitWith(b, c, clients, nil)
}

// benchReserveCommitWith is benchReserveCommit on a store whose Config edit
// changed.
func benchReserveCommitWith(b *testing.B, c *clientv3.Client, clients int, edit func(*etcdstore.Config)) {
	ctx := context.Background()
	s := benchStoreWith(b, c, 1, edit)
	if _, err := reserveCommit(ctx, s, "warm"); err != nil { // grants the terminals' lease
		b.Fatal(err)
	}
	defer reportBatching(b, s, s.WriteStats())
	measure(b, clients, func(client, i int) error {
		_, err := reserveCommit(ctx, s, "rc-"+strconv.Itoa(client)+"-"+strconv.Itoa(i))
		return err
	})
}

// reportBatching reports the writes per write Txn of s since since
// (internal/txnkit/batch.go): 1 when nothing was merged.
func reportBatching(b *testing.B, s *etcdstore.Store, since etcdstore.WriteStats) {
	st := s.WriteStats()
	txns := st.Txns - since.Txns
	if txns == 0 {
		return
	}
	writes := (txns - (st.Batches - since.Batches)) + (st.BatchedWrites - since.BatchedWrites)
	b.ReportMetric(float64(writes)/float64(txns), "writes/Txn")
}

// benchReserveNodes: one op is a reservation of an Actor under a capacity
// policy, client c's i-th on node (c + i×clients) mod nodes.
func benchReserveNodes(b *testing.B, c *clientv3.Client, clients, nodes int) {
	ctx := context.Background()
	s := benchStore(b, c, nodes)
	s.SetCapacityPolicy(conformance.ActorLimit(1 << 40))
	measure(b, clients, func(client, i int) error {
		n := (client + i*clients) % nodes
		res, err := s.Reserve(ctx, reserveRequest(authority.ObjectActor, "a-"+strconv.Itoa(client)+"-"+strconv.Itoa(i), benchTarget(n)))
		if err != nil {
			return err
		}
		if res.Kind != authority.KindReserved {
			return fmt.Errorf("reserve: %s", res.Kind)
		}
		return nil
	})
}

// rowKeys are the keys of one active row on TargetA: the row, its capacity
// index entry and its owner index entry (the layout of doc.go).
func rowKeys(s *etcdstore.Store, key authority.Key) [3]string {
	ns := s.Namespace()
	return [3]string{
		ns + "rows/" + string(key),
		ns + "capacity/mesh-1/node-a/1/row/" + string(key),
		ns + "owner-rows/owner-a/1/" + string(key),
	}
}

// rowTemplate makes one active Spot on TargetA through s and returns the
// stored values of its keys (rowKeys).
func rowTemplate(b *testing.B, c *clientv3.Client, s *etcdstore.Store) [3]string {
	b.Helper()
	if _, err := reserveCommit(context.Background(), s, "template"); err != nil {
		b.Fatal(err)
	}
	var values [3]string
	for i, k := range rowKeys(s, spotKey(b, "template")) {
		resp, err := c.Get(context.Background(), k)
		if err != nil || len(resp.Kvs) != 1 {
			b.Fatalf("read template key %s: %v", k, err)
		}
		values[i] = string(resp.Kvs[0].Value)
	}
	return values
}

// seedRows writes n copies of the active row template (the stored values of
// a real row's keys) under keys name(i), with raw Txns on 8 goroutines, and
// returns each row's version.
func seedRows(b *testing.B, c *clientv3.Client, s *etcdstore.Store, template [3]string, n int, name func(i int) authority.Key) []authority.StoreVersion {
	b.Helper()
	const perTxn, workers = 42, 8 // 3 puts a row, within --max-txn-ops 128
	versions := make([]authority.StoreVersion, n)
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for from := w * perTxn; from < n; from += workers * perTxn {
				to := min(n, from+perTxn)
				ops := make([]clientv3.Op, 0, 3*(to-from))
				for i := from; i < to; i++ {
					for j, k := range rowKeys(s, name(i)) {
						ops = append(ops, clientv3.OpPut(k, template[j]))
					}
				}
				resp, err := c.Txn(context.Background()).Then(ops...).Commit()
				if err != nil {
					errs[w] = err
					return
				}
				for i := from; i < to; i++ {
					versions[i] = authority.StoreVersion(strconv.FormatInt(resp.Header.Revision, 10))
				}
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		b.Fatal(err)
	}
	return versions
}

// benchAggregate16: one op prepares and commits an aggregate moving 16
// active Spots of TargetA to a new owner on another node; every op has its
// own rows.
func benchAggregate16(b *testing.B, c *clientv3.Client, clients int) {
	const parts = 16
	ctx := context.Background()
	s := benchStore(b, c, 2)
	target := benchTarget(1)
	template := rowTemplate(b, c, s)
	capacity := authority.CapacityVector{}
	for range parts {
		var err error
		if capacity, err = authority.AddCapacity(capacity, conformance.Capacity(authority.ObjectUserSpot, conformance.DefaultStableType)); err != nil {
			b.Fatal(err)
		}
	}
	name := func(i int) authority.Key { return spotKey(b, fmt.Sprintf("agg-%07d", i)) }
	versions := seedRows(b, c, s, template, b.N*parts, name)
	digest := sha256.Sum256([]byte("inventory"))
	seq := func(client, i int) int { return client + i*clients } // distinct across clients
	measure(b, clients, func(client, i int) error {
		op := seq(client, i)
		req := authority.AggregatePrepareRequest{
			AggregateID: "agg-" + strconv.Itoa(op), AggregateGeneration: 1,
			TargetOwner: target.Owner, TargetDescriptor: target.Descriptor(),
			TargetDescriptorLifecycleGeneration: target.NodeLifecycleGeneration,
			Capacity:                            capacity,
			InventoryDigest:                     digest[:],
		}
		for p := range parts {
			j := op*parts + p
			req.Participants = append(req.Participants, authority.AggregateParticipant{
				AuthorityKey: name(j), ExpectedStoreVersion: versions[j],
				OwnerTransition: authority.TransitionNewOwner, AuthorityPayload: benchPayload,
			})
		}
		pr, err := s.PrepareAggregate(ctx, req)
		if err != nil {
			return err
		}
		if pr.Kind != authority.KindPrepared {
			return fmt.Errorf("prepare: %s", pr.Kind)
		}
		cr, err := s.CommitAggregate(ctx, pr.Fence)
		if err != nil {
			return err
		}
		if cr.Kind != authority.KindCommitted {
			return fmt.Errorf("commit: %s", cr.Kind)
		}
		return nil
	})
}

// listBench pages through 100k rows, 1000 a page; one op is one page. The
// rows are seeded once per benchmark run.
type listBench struct {
	s *etcdstore.Store
}

const listRows = 100_000

func (l *listBench) run(b *testing.B, c *clientv3.Client) {
	if l.s == nil {
		// the store serves every invocation; BenchmarkEtcd closes it
		s, err := etcdstore.New(context.Background(), etcdstore.Config{Client: c, Namespace: etcdtest.Namespace()})
		if err != nil {
			b.Fatal(err)
		}
		t := conformance.TargetA
		if err := s.MarkLive(context.Background(), t.Descriptor(), t.NodeLifecycleGeneration, t.Owner, time.Hour); err != nil {
			b.Fatal(err)
		}
		template := rowTemplate(b, c, s)
		seedRows(b, c, s, template, listRows-1, func(i int) authority.Key { return spotKey(b, fmt.Sprintf("list-%06d", i)) })
		l.s = s
	}
	ctx := context.Background()
	prefix := authority.KindPrefix(authority.ObjectUserSpot)
	var cursor authority.ScanCursor
	rows := 0
	start := time.Now()
	measure(b, 1, func(_, _ int) error {
		res, err := l.s.ListAuthorities(ctx, prefix, cursor, authority.MaxScanLimit)
		if err != nil {
			return err
		}
		if res.Kind != authority.KindPage || len(res.Items) == 0 {
			return fmt.Errorf("list: %s, %d items", res.Kind, len(res.Items))
		}
		rows += len(res.Items)
		if cursor = res.NextCursor; cursor == "" {
			if rows != listRows {
				return fmt.Errorf("listed %d rows, want %d", rows, listRows)
			}
			rows = 0
		}
		return nil
	})
	b.ReportMetric(float64(time.Since(start).Milliseconds())*float64(listRows/authority.MaxScanLimit)/float64(b.N), "ms/100k-rows")
}
