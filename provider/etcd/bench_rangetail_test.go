package etcd_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	"github.com/zlink-systems/authority/internal/etcdpage"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// BenchmarkRangeTail measures what etcd's range with a limit costs as the
// keys after the page grow (docs/scale.md, Growth): a Range (or a Txn's
// range) answers its Count, the number of keys in the whole range, so etcd
// walks its key index from the page to the range's end whatever the limit.
// Each sub-benchmark reads the first 1000 keys of a prefix holding tail
// keys; "stream" reads them as a listing's first page does (etcdpage.Stream:
// RangeStream, which does not count); "window" reads the next 1000 as a
// page after a cursor does (etcdpage.ReadAfter); "bounded" reads the 1000
// with the range ending after the last of them. The same run compares the
// sizes with each other.
//
//	go test -run '^$' -bench RangeTail -benchtime 50x ./provider/etcd/
func BenchmarkRangeTail(b *testing.B) {
	srv := etcdtest.Start(b, etcdtest.WithFsync(false))
	c := srv.Client(b)
	ctx := context.Background()
	ns := etcdtest.Namespace()
	value := string(make([]byte, 100))
	for _, tail := range []int{10_000, 100_000} {
		prefix := ns + strconv.Itoa(tail) + "/"
		for from := 0; from < tail; from += 100 {
			ops := make([]clientv3.Op, 0, 100)
			for i := from; i < from+100; i++ {
				ops = append(ops, clientv3.OpPut(fmt.Sprintf("%s%08d", prefix, i), value))
			}
			if _, err := c.Txn(ctx).Then(ops...).Commit(); err != nil {
				b.Fatal(err)
			}
		}
		end := clientv3.GetPrefixRangeEnd(prefix)
		b.Run(fmt.Sprintf("limit/tail=%d", tail), func(b *testing.B) {
			for b.Loop() {
				resp, err := c.Get(ctx, prefix, clientv3.WithRange(end), clientv3.WithLimit(1000))
				if err != nil || len(resp.Kvs) != 1000 || resp.Count != int64(tail) {
					b.Fatalf("page: %v", err)
				}
			}
		})
		b.Run(fmt.Sprintf("stream/tail=%d", tail), func(b *testing.B) {
			for b.Loop() {
				p, err := etcdpage.Stream(ctx, c.KV, prefix, end, 0, 1000)
				if err != nil || len(p.Kvs) != 1000 || !p.More {
					b.Fatalf("page: %v", err)
				}
			}
		})
		b.Run(fmt.Sprintf("window/tail=%d", tail), func(b *testing.B) {
			// the page after a cursor at the 1000th key, as a listing's
			// later pages read it (etcdpage.ReadAfter)
			after := fmt.Sprintf("%s%08d", prefix, 999) + "\x00"
			for b.Loop() {
				p, err := etcdpage.ReadAfter(ctx, c.KV, after, prefix, end, 0, 1000)
				if err != nil || len(p.Kvs) != 1000 || !p.More {
					b.Fatalf("page: %v", err)
				}
			}
		})
		b.Run(fmt.Sprintf("bounded/tail=%d", tail), func(b *testing.B) {
			last := fmt.Sprintf("%s%08d", prefix, 999)
			for b.Loop() {
				resp, err := c.Get(ctx, prefix, clientv3.WithRange(last+"\x00"), clientv3.WithLimit(1000))
				if err != nil || len(resp.Kvs) != 1000 {
					b.Fatalf("page: %v", err)
				}
			}
		})
	}
}
