package escrow_test

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
)

// BenchmarkEscrowReserve measures what escrow mode costs a reservation on
// its hot path: one op is a reservation of an Actor on one node, from 16
// clients, under a limit far above what the run reserves. Baseline:
// escrow=off, a store as before on shard 0's server. escrow=on/chunk=N: the
// same store in escrow mode over the three shards (the ledger of the node
// in its home shard), the mover's Chunk N; grants/op is how often a
// reservation needed a cross-shard step.
func BenchmarkEscrowReserve(b *testing.B) {
	const clients = 16
	policy := conformance.ActorLimit(1 << 40)
	b.Run("escrow=off", func(b *testing.B) {
		ns := etcdtest.Namespace()
		c := servers[0].Client(b)
		s, err := etcdstore.New(context.Background(), etcdstore.Config{Client: c, Namespace: ns, CapacityPolicy: policy, SkipVersionCheck: true})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			_ = s.Close()
			_, _ = c.Delete(context.Background(), ns, clientv3.WithPrefix())
		})
		if err := s.MarkLive(context.Background(), node, lifecycle, target.Owner, liveTTL); err != nil {
			b.Fatal(err)
		}
		benchReserve(b, s, clients)
	})
	for _, chunk := range []int64{8, 64} {
		b.Run(fmt.Sprintf("escrow=on/chunk=%d", chunk), func(b *testing.B) {
			set := openShards(b, "", setOptions{policy: policy, chunk: chunk})
			before := set.mover.Stats()
			benchReserve(b, set.stores[0], clients)
			b.ReportMetric(float64(set.mover.Stats().Grants-before.Grants)/float64(b.N), "grants/op")
		})
	}
}

var benchSeq atomic.Int64

func benchReserve(b *testing.B, s *etcdstore.Store, clients int) {
	ctx := context.Background()
	b.SetParallelism(clients)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			res, err := s.Reserve(ctx, reserveRequest(authority.ObjectActor, "b"+strconv.FormatInt(benchSeq.Add(1), 10)))
			if err != nil {
				b.Error(err)
				return
			}
			if res.Kind != authority.KindReserved {
				b.Errorf("reserve: %s", res.Kind)
				return
			}
		}
	})
}
