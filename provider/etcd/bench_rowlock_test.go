package etcd_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"

	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// BenchmarkRowLockCompare measures what the row lock fence (lockFree:
// storeversion.RowLocks) costs etcd: a compare-exchange-shaped Txn (the
// row's version and its owner's liveness compared, the row put, both read on
// failure) with and without the compare of the row's lock key absent and
// its read on failure, one after the other in one run on one server with
// fsync on, at 1 and 64 clients. Run:
//
//	go test -run='^$' -bench=BenchmarkRowLockCompare -benchtime=4000x -count=3 ./provider/etcd/
func BenchmarkRowLockCompare(b *testing.B) {
	srv := etcdtest.Start(b, etcdtest.WithFsync(true))
	c := srv.Client(b)
	value := string(make([]byte, rowValueSize(b, c)))
	for _, n := range benchClients {
		for _, lock := range []bool{false, true} {
			b.Run(fmt.Sprintf("lock=%v/clients=%d", lock, n), func(b *testing.B) { benchCASShaped(b, c, n, value, lock) })
		}
	}
}

// benchCASShaped runs CAS-shaped Txns, each client on a row of its own.
func benchCASShaped(b *testing.B, c *clientv3.Client, clients int, value string, lock bool) {
	ctx := context.Background()
	ns := etcdtest.Namespace()
	live := ns + "owners/owner-a/1/mesh-1/node-a/1"
	if _, err := c.Put(ctx, live, "live"); err != nil {
		b.Fatal(err)
	}
	liveCmp := clientv3.Compare(clientv3.CreateRevision(live), ">", 0)
	var mu sync.Mutex
	revs := make([]int64, clients)
	measure(b, clients, func(client, _ int) error {
		key := "actor/cas-" + strconv.Itoa(client)
		row, lk := ns+"rows/"+key, ns+"row-locks/"+key
		mu.Lock()
		rev := revs[client]
		mu.Unlock()
		cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(row), "=", rev), liveCmp}
		els := []clientv3.Op{clientv3.OpGet(row), clientv3.OpGet(live, clientv3.WithKeysOnly())}
		if lock {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(lk), "=", 0))
			els = append(els, clientv3.OpGet(lk))
		}
		resp, err := c.Txn(ctx).If(cmps...).Then(clientv3.OpPut(row, value)).Else(els...).Commit()
		if err != nil {
			return err
		}
		if !resp.Succeeded {
			return errors.New("cas-shaped: compare failed")
		}
		mu.Lock()
		revs[client] = resp.Header.Revision
		mu.Unlock()
		return nil
	})
}
