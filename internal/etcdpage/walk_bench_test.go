package etcdpage_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/zlink-systems/authority/internal/etcdpage"
	"github.com/zlink-systems/authority/internal/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// BenchmarkPageRead reads one 1000-key page of a range of 200 000 keys,
// once at its start (199 000 keys after the page) and once at its end (none
// after it), in one run: etcd counts every key of a limited range up to its
// end, so the difference is that walk, and it grows with the keys after the
// page, not with the page. Reports the walk per key after the page.
//
//	go test -run='^$' -bench=BenchmarkPageRead ./internal/etcdpage/
func BenchmarkPageRead(b *testing.B) {
	const keys, page = 200_000, 1000
	srv := etcdtest.Start(b)
	c := srv.Client(b)
	ctx := context.Background()
	ns := etcdtest.Namespace()
	key := func(i int) string { return fmt.Sprintf("%sk%07d", ns, i) }
	for i := 0; i < keys; i += 100 {
		ops := make([]clientv3.Op, 0, 100)
		for j := i; j < i+100; j++ {
			ops = append(ops, clientv3.OpPut(key(j), "v"))
		}
		if _, err := c.Txn(ctx).Then(ops...).Commit(); err != nil {
			b.Fatal(err)
		}
	}
	end := clientv3.GetPrefixRangeEnd(ns)
	at := map[string]float64{}
	for _, tc := range []struct {
		name string
		from int
	}{{"start", 0}, {"end", keys - page}} {
		b.Run(tc.name, func(b *testing.B) {
			for b.Loop() {
				p, err := etcdpage.Read(ctx, c, key(tc.from), end, 0, page)
				if err != nil || len(p.Kvs) != page {
					b.Fatalf("page: %d keys, %v", len(p.Kvs), err)
				}
			}
			at[tc.name] = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
		})
	}
	if at["start"] > 0 && at["end"] > 0 {
		b.Logf("walk per key after the page: %.0f ns (page at start %.2f ms, at end %.2f ms)",
			(at["start"]-at["end"])/float64(keys-page), at["start"]/1e6, at["end"]/1e6)
	}
}
