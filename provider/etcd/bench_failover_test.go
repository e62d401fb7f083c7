package etcd_test

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// failoverRows and failoverPayload are what BenchmarkFailover moves an
// iteration: an owner's 20k rows of 64 B payloads.
const failoverRows = 20_000

var failoverPayload = bytes.Repeat([]byte("f"), 64)

// BenchmarkFailover measures moving a lost owner's rows to its next lease
// generation, on an embedded etcd with fsync on and the README's production
// limits (--max-txn-ops 1024, --max-request-bytes 4 MiB). Each iteration
// moves failoverRows rows and the benchmark reports rows/s:
//
//   - rebind: OwnerLease.RebindRows onto the next generation (reads the old
//     index and the rows, then Txns of 341 rows, each row fenced);
//
//   - raw-rewrite: the physical limit, the same rows rewritten with the
//     plain client in Txns of the same size (each row compared on its
//     ModRevision, its value put again, an index entry deleted and one put),
//     with keys, values and revisions known beforehand.
//
//     go test -run '^$' -bench BenchmarkFailover -benchtime 1x ./provider/etcd/
func BenchmarkFailover(b *testing.B) {
	srv := etcdtest.Start(b, etcdtest.WithFsync(true), etcdtest.WithMaxTxnOps(1024), etcdtest.WithMaxRequestBytes(4<<20))
	c := srv.Client(b)
	ctx := context.Background()
	s := newStore(b, c, etcdstore.Config{MaxTxnOps: 1024, MaxRequestBytes: 4 << 20})
	lease, err := s.Registry().Acquire(ctx, conformance.NodeA, conformance.NodeLifecycle, "failover", time.Minute)
	if err != nil {
		b.Fatal(err)
	}
	fillFailover(b, s, conformance.Target(conformance.NodeA, conformance.NodeLifecycle, lease.Token()))
	b.Run("rebind", func(b *testing.B) {
		var moved int64
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			next, err := s.Registry().Acquire(ctx, conformance.NodeA, conformance.NodeLifecycle, "failover", time.Minute)
			if err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			n, err := next.RebindRows(ctx, lease.Token())
			if err != nil || n != failoverRows {
				b.Fatalf("moved %d of %d: %v", n, failoverRows, err)
			}
			moved += n
			b.StopTimer()
			_ = lease.Close(ctx)
			lease = next
			b.StartTimer()
		}
		b.ReportMetric(float64(moved)/b.Elapsed().Seconds(), "rows/s")
	})
	defer func() { _ = lease.Close(ctx) }()
	b.Run("raw-rewrite", func(b *testing.B) { benchRawRewrite(b, c, s) })
}

// benchRawRewrite rewrites the rows of s with the plain client, 341 rows a
// Txn as a rebind Txn takes them at --max-txn-ops 1024.
func benchRawRewrite(b *testing.B, c *clientv3.Client, s *etcdstore.Store) {
	ctx := context.Background()
	resp, err := c.Get(ctx, schema.Prefix(s.Namespace(), schema.EntryRow), clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != failoverRows {
		b.Fatalf("read %d rows: %v", len(resp.Kvs), err)
	}
	kvs := resp.Kvs
	idx := func(gen int, kv []byte) string { return fmt.Sprintf("%sraw/%d/%s", s.Namespace(), gen, kv) }
	const perTxn = 1024 / 3
	var moved int64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for start := 0; start < len(kvs); start += perTxn {
			part := kvs[start:min(start+perTxn, len(kvs))]
			cmps := make([]clientv3.Cmp, len(part))
			ops := make([]clientv3.Op, 0, 3*len(part))
			for j, kv := range part {
				cmps[j] = clientv3.Compare(clientv3.ModRevision(string(kv.Key)), "=", kv.ModRevision)
				ops = append(ops, clientv3.OpPut(string(kv.Key), string(kv.Value)),
					clientv3.OpDelete(idx(i, kv.Key)), clientv3.OpPut(idx(i+1, kv.Key), ""))
			}
			tr, err := c.Txn(ctx).If(cmps...).Then(ops...).Commit()
			if err != nil || !tr.Succeeded {
				b.Fatalf("raw rewrite: %v", err)
			}
			for _, kv := range part {
				kv.ModRevision = tr.Header.Revision
			}
			moved += int64(len(part))
		}
	}
	b.ReportMetric(float64(moved)/b.Elapsed().Seconds(), "rows/s")
}

// fillFailover places failoverRows active Spots of target, payload
// failoverPayload, 32 at a time.
func fillFailover(b *testing.B, s *etcdstore.Store, target authority.CreationTarget) {
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	next := make(chan int)
	ctx := context.Background()
	for range 32 {
		wg.Go(func() {
			for i := range next {
				req := reserveRequest(authority.ObjectUserSpot, fmt.Sprintf("fo-%06d", i), target)
				req.CreatingPayload = failoverPayload
				res, err := s.Reserve(ctx, req)
				if err == nil && res.Kind != authority.KindReserved {
					err = fmt.Errorf("reserve: %s", res.Kind)
				}
				if err == nil {
					var cr authority.CommitResult
					cr, err = s.Commit(ctx, authority.CommitRequest{Key: req.Key, ReservationID: res.ReservationID,
						ExpectedStoreVersion: res.Creating.StoreVersion, Target: target, ReadyPayload: failoverPayload})
					if err == nil && cr.Kind != authority.KindCommitted {
						err = fmt.Errorf("commit: %s", cr.Kind)
					}
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	for i := range failoverRows {
		select {
		case next <- i:
		case err := <-errs:
			close(next)
			wg.Wait()
			b.Fatal(err)
		}
	}
	close(next)
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}
