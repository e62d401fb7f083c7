package embedded

import (
	"context"
	"os"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestStartServesAndKeepsGivenDir(t *testing.T) {
	dir := t.TempDir()
	s, err := Start(context.Background(), Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := c.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	resp, err := c.Get(ctx, "k")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v" {
		t.Fatalf("get: %v %v", resp, err)
	}
	// the configured limit is the server's: a Txn of 129 ops is refused
	ops := make([]clientv3.Op, DefaultMaxTxnOps+1)
	for i := range ops {
		ops[i] = clientv3.OpPut("k"+string(rune('a'+i%26))+string(rune('a'+i/26)), "v")
	}
	if _, err := c.Txn(ctx).Then(ops...).Commit(); err == nil {
		t.Fatal("a Txn over --max-txn-ops was accepted")
	}
	_ = c.Close()
	s.Close()
	s.Close()
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("given data dir removed: %v", err)
	}
}

func TestTempDirRemovedOnClose(t *testing.T) {
	s, err := Start(context.Background(), Config{MaxTxnOps: 256})
	if err != nil {
		t.Fatal(err)
	}
	dir := s.tempDir
	if dir == "" {
		t.Fatal("no temp dir")
	}
	s.Close()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("temp dir still there: %v", err)
	}
}

func TestBadClientAddr(t *testing.T) {
	if _, err := Start(context.Background(), Config{ClientAddr: "not an addr/x"}); err == nil {
		t.Fatal("bad address accepted")
	}
}
