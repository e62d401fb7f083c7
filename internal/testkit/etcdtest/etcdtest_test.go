package etcdtest

import (
	"context"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestStartPutGet(t *testing.T) {
	s := Start(t, WithMaxTxnOps(16))
	if strings.HasSuffix(s.Endpoint(), ":2379") || strings.HasSuffix(s.Endpoint(), ":0") {
		t.Fatalf("endpoint %q is not a kernel-chosen port", s.Endpoint())
	}
	c := s.Client(t)
	ns := Namespace()
	if !strings.HasPrefix(ns, "/etcdtest/") || !strings.HasSuffix(ns, "/") || ns == Namespace() {
		t.Fatalf("bad namespace %q", ns)
	}
	ctx := context.Background()
	if _, err := c.Put(ctx, ns+"k", "v"); err != nil {
		t.Fatal(err)
	}
	resp, err := c.Get(ctx, ns+"k")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v" {
		t.Fatalf("get: %v %v", resp, err)
	}
	s.Close()
	s.Close() // idempotent
}
