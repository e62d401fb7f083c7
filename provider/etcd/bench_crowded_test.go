package etcd_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// BenchmarkEtcdCrowdedNode measures reservations under a capacity policy on
// a node that already holds many capacity entries (active rows), while 4
// other clients write unrelated keys; bg-puts/s is their rate, which a
// reservation's work inside etcd's apply loop slows. Not an issue 7 target:
// it shows how a reservation's cost grows with the entries on its node.
//
//	go test -run='^$' -bench=BenchmarkEtcdCrowdedNode -benchtime=400x ./provider/etcd/
func BenchmarkEtcdCrowdedNode(b *testing.B) {
	srv := etcdtest.Start(b, etcdtest.WithFsync(true))
	c := srv.Client(b)
	for _, entries := range []int{0, 50_000} {
		for _, clients := range benchClients {
			b.Run(fmt.Sprintf("entries=%d/clients=%d", entries, clients), func(b *testing.B) {
				s := benchStore(b, c, 1)
				template := rowTemplate(b, c, s)
				seedRows(b, c, s, template, entries, func(i int) authority.Key { return spotKey(b, "seed-"+strconv.Itoa(i)) })
				s.SetCapacityPolicy(conformance.ActorLimit(1 << 40))
				ctx := context.Background()
				var stop atomic.Bool
				var puts atomic.Int64
				var wg sync.WaitGroup
				ns := s.Namespace() + "bg/"
				for w := range 4 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := 0; !stop.Load(); i++ {
							if _, err := c.Put(ctx, ns+strconv.Itoa(w)+"/"+strconv.Itoa(i), "x"); err == nil {
								puts.Add(1)
							}
						}
					}()
				}
				start := time.Now()
				measure(b, clients, func(client, i int) error {
					res, err := s.Reserve(ctx, reserveRequest(authority.ObjectActor, "a-"+strconv.Itoa(client)+"-"+strconv.Itoa(i), conformance.TargetA))
					if err == nil && res.Kind != authority.KindReserved {
						err = fmt.Errorf("reserve: %s", res.Kind)
					}
					return err
				})
				elapsed := time.Since(start)
				stop.Store(true)
				wg.Wait()
				b.ReportMetric(float64(puts.Load())/elapsed.Seconds(), "bg-puts/s")
				if _, err := c.Delete(ctx, s.Namespace(), clientv3.WithPrefix()); err != nil {
					b.Fatal(err)
				}
			})
		}
	}
}
