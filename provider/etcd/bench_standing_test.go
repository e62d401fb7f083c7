package etcd_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// BenchmarkStandingFence measures what the standing fence (shardfence.go:
// a single-cluster store's writes and row reads compare and read the shard
// map key) costs: compare-exchanges and row reads of a plain store, against
// the same on a store without it (Config.ShardMember: no map fence), one
// after the other in one run on one server with fsync on. Run:
//
//	go test -run='^$' -bench=BenchmarkStandingFence -benchtime=4000x -count=3 ./provider/etcd/
func BenchmarkStandingFence(b *testing.B) {
	srv := etcdtest.Start(b, etcdtest.WithFsync(true))
	c := srv.Client(b)
	for _, n := range benchClients {
		for _, fenced := range []bool{false, true} {
			edit := func(cfg *etcdstore.Config) { cfg.ShardMember = !fenced }
			b.Run(fmt.Sprintf("cas/fence=%v/clients=%d", fenced, n), func(b *testing.B) { benchCASWith(b, c, n, edit) })
			b.Run(fmt.Sprintf("read/fence=%v/clients=%d", fenced, n), func(b *testing.B) { benchReadWith(b, c, n, edit) })
		}
	}
}

// benchReadWith reads rows, each client its own, on a store whose Config
// edit changed.
func benchReadWith(b *testing.B, c *clientv3.Client, clients int, edit func(*etcdstore.Config)) {
	ctx := context.Background()
	s := benchStoreWith(b, c, 1, edit)
	keys := make([]authority.Key, clients)
	for i := range clients {
		id := "read-" + strconv.Itoa(i)
		if _, err := reserveCommit(ctx, s, id); err != nil {
			b.Fatal(err)
		}
		keys[i] = spotKey(b, id)
	}
	measure(b, clients, func(client, _ int) error {
		res, err := s.ReadAuthority(ctx, keys[client])
		if err != nil {
			return err
		}
		if res.Kind != authority.KindSnapshot {
			return fmt.Errorf("read: %s", res.Kind)
		}
		return nil
	})
}
