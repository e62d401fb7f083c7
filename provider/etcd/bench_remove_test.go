package etcd_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/zlink-systems/authority/conformance"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
)

// BenchmarkRemoveAllByOwner removes an owner holding rows rows, reading its
// owner index one Txn batch at a time (page=32, the earlier code) and a page
// at a time (page=2048), in one run on the shared server. The difference is
// etcd walking the rest of a limited range on every read (it counts the
// range's keys), which grows with the owner's rows. Reports rows/s.
//
//	go test -run='^$' -bench=BenchmarkRemoveAllByOwner -benchtime=1x ./provider/etcd/
func BenchmarkRemoveAllByOwner(b *testing.B) {
	for _, rows := range []int{2000, 20000} {
		for _, page := range []int{32, 2048} {
			b.Run(fmt.Sprintf("rows=%d/page=%d", rows, page), func(b *testing.B) { benchRemove(b, rows, page) })
		}
	}
}

func benchRemove(b *testing.B, rows, page int) {
	etcdstore.SetOwnerIndexPage(b, page)
	ctx := context.Background()
	s := newStore(b, nil, etcdstore.Config{})
	tg := conformance.TargetA
	if err := s.MarkLive(ctx, tg.Descriptor(), tg.NodeLifecycleGeneration, tg.Owner, time.Hour); err != nil {
		b.Fatal(err)
	}
	var removed int64
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		fillOwner(b, s, rows, fmt.Sprintf("rm%d-", i))
		b.StartTimer()
		n, err := s.RemoveAllByOwner(ctx, tg.Owner)
		if err != nil || n != int64(rows) {
			b.Fatalf("removed %d of %d: %v", n, rows, err)
		}
		removed += n
	}
	b.ReportMetric(float64(removed)/b.Elapsed().Seconds(), "rows/s")
}

// fillOwner places rows active Spots of TargetA's owner, 32 at a time.
func fillOwner(b *testing.B, s *etcdstore.Store, rows int, prefix string) {
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	next := make(chan int)
	for range 32 {
		wg.Go(func() {
			for i := range next {
				if _, err := reserveCommit(context.Background(), s, fmt.Sprintf("%s%06d", prefix, i)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	for i := range rows {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}
