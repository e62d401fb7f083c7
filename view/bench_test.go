package view_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/view"
)

// benchRows is how many rows the view benchmarks read.
const benchRows = 256

// BenchmarkView compares, at 64 clients on an embedded etcd with fsync on,
// consistent view reads, bounded-stale (1 s) view reads and a plain
// linearizable etcd Get of the same rows, each reporting ops/s.
func BenchmarkView(b *testing.B) {
	store, h, client := etcdHarness(b, true)
	fx := conformance.NewFixture(b, h)
	keys := make([]authority.Key, benchRows)
	for i := range keys {
		id := fmt.Sprintf("bench-%03d", i)
		fx.Active(authority.ObjectUserSpot, id, conformance.TargetA)
		keys[i] = fx.Key(authority.ObjectUserSpot, id)
	}
	v, err := view.New(b.Context(), store, view.Config{})
	require.NoError(b, err)
	defer v.Close()
	layout := schema.NewLayout(etcdtest.Namespace())
	modes := []struct {
		name string
		read func(key authority.Key) error
	}{
		{"consistent", func(key authority.Key) error {
			_, err := v.Read(b.Context(), key, view.Freshness{})
			return err
		}},
		{"stale", func(key authority.Key) error {
			_, err := v.Read(b.Context(), key, view.Freshness{MaxStaleness: time.Second})
			return err
		}},
		{"raw-get", func(key authority.Key) error {
			_, err := client.Get(b.Context(), layout.Row(key))
			return err
		}},
	}
	const clients = 64
	for _, m := range modes {
		b.Run(m.name+"/clients=64", func(b *testing.B) {
			b.ReportAllocs() // an op is one read: allocs/op are per read
			var next atomic.Int64
			var wg sync.WaitGroup
			var failed atomic.Value
			b.ResetTimer()
			start := time.Now()
			for range clients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						i := next.Add(1)
						if i > int64(b.N) {
							return
						}
						if err := m.read(keys[i%benchRows]); err != nil {
							failed.Store(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "ops/s")
			if err, _ := failed.Load().(error); err != nil {
				b.Fatal(err)
			}
		})
	}
}
