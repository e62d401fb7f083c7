package etcdtest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/zlink-systems/authority/internal/testkit/testcerts"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// asExternal makes the environment name emb as an external cluster for the
// rest of t.
func asExternal(t *testing.T, emb *Server) {
	t.Setenv(EnvEndpoints, " "+emb.Endpoint()+", ")
	for _, v := range []string{EnvCACert, EnvCert, EnvKey, EnvUser, EnvPassword, EnvPrefix} {
		t.Setenv(v, "")
	}
	if !External() {
		t.Fatal("External() is false with endpoints set")
	}
}

// failFast shortens the connection check for the rest of t, for cases that
// must fail (nothing waits for it otherwise).
func failFast(t *testing.T) {
	old := connectTimeout
	connectTimeout = 300 * time.Millisecond
	t.Cleanup(func() { connectTimeout = old })
}

func requireOutside(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, ErrOutsideNamespace) {
		t.Fatalf("%s: got %v, want ErrOutsideNamespace", what, err)
	}
}

func TestExternalGuardsAndCleansUp(t *testing.T) {
	ctx := context.Background()
	emb := Start(t)
	raw := emb.Client(t) // an embedded server's client: unguarded
	foreign, err := raw.Put(ctx, "/foreign", "x")
	if err != nil {
		t.Fatal(err)
	}
	asExternal(t, emb)

	if _, err := StartMain(WithMaxTxnOps(16)); !errors.Is(err, ErrNeedsEmbedded) {
		t.Fatalf("custom server limits on an external cluster: got %v, want ErrNeedsEmbedded", err)
	}
	skipped := false
	t.Run("StartWithServerSettingsSkips", func(t *testing.T) {
		defer func() { skipped = t.Skipped() }()
		Start(t, WithDir(t.TempDir()))
	})
	if !skipped {
		t.Fatal("Start with a data directory did not skip on an external cluster")
	}

	ext, err := StartMain()
	if err != nil {
		t.Fatal(err)
	}
	c, err := ext.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	ns := Namespace()
	if _, err := c.Put(ctx, ns+"a", "1"); err != nil {
		t.Fatal(err)
	}
	lease, err := c.Grant(ctx, 3600)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(ns), "<", 1<<40).WithPrefix()).
		Then(clientv3.OpPut(ns+"b", "2", clientv3.WithLease(lease.ID))).Commit()
	if err != nil || !resp.Succeeded {
		t.Fatalf("txn inside the namespace: %v %v", resp, err)
	}
	if _, err := c.Get(ctx, Root(), clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil {
		t.Fatalf("reading the root: %v", err)
	}

	// every request reaching outside the root is refused before sending
	_, err = c.Get(ctx, "/foreign")
	requireOutside(t, "get", err)
	_, err = c.Put(ctx, "/etcdtesu", "x")
	requireOutside(t, "put next to the root", err)
	_, err = c.Delete(ctx, "", clientv3.WithPrefix())
	requireOutside(t, "delete everything", err)
	_, err = c.Get(ctx, ns, clientv3.WithFromKey())
	requireOutside(t, "get from key", err)
	_, err = c.Get(ctx, ns, clientv3.WithRange(strings.TrimSuffix(Root(), "/")+"1"))
	requireOutside(t, "get past the root", err)
	_, err = c.Txn(ctx).If(clientv3.Compare(clientv3.Value("/foreign"), "=", "x")).Then(clientv3.OpPut(ns+"c", "3")).Commit()
	requireOutside(t, "txn comparing outside", err)
	_, err = c.Txn(ctx).Then(clientv3.OpPut(ns+"c", "3")).Else(clientv3.OpTxn(nil, []clientv3.Op{clientv3.OpDelete("/foreign")}, nil)).Commit()
	requireOutside(t, "nested txn writing outside", err)
	_, err = c.Do(ctx, clientv3.OpGet("/foreign"))
	requireOutside(t, "do", err)
	_, err = c.Compact(ctx, foreign.Header.Revision)
	requireOutside(t, "compact", err)
	wctx, cancel := context.WithCancel(ctx)
	wr, ok := <-c.Watch(wctx, "/", clientv3.WithPrefix())
	cancel()
	if !ok || !wr.Canceled || wr.Err() == nil {
		t.Fatalf("watch outside the root: %+v %v", wr, ok)
	}
	if got := len(ext.Violations()); got != 10 {
		t.Fatalf("%d violations recorded, want 10: %q", got, ext.Violations())
	}
	if g, err := raw.Get(ctx, ns+"c"); err != nil || len(g.Kvs) != 0 {
		t.Fatalf("a refused txn wrote: %v %v", g, err)
	}

	_ = c.Close()
	ext.Close()
	ext.Close() // idempotent
	// the namespace and the lease are gone; the foreign key and the server stay
	g, err := raw.Get(ctx, ns, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || g.Count != 0 {
		t.Fatalf("namespace left behind: %v %v", g, err)
	}
	ttl, err := raw.TimeToLive(ctx, lease.ID)
	if err != nil || ttl.TTL != -1 {
		t.Fatalf("lease not revoked: %+v %v", ttl, err)
	}
	g, err = raw.Get(ctx, "/foreign")
	if err != nil || len(g.Kvs) != 1 || g.Kvs[0].ModRevision != foreign.Header.Revision {
		t.Fatalf("foreign key touched: %v %v", g, err)
	}
}

func TestExternalSettingsAreChecked(t *testing.T) {
	emb := Start(t)
	asExternal(t, emb)
	t.Setenv(EnvPrefix, "/check/")
	if ns := Namespace(); !strings.HasPrefix(ns, "/check/") || strings.Count(ns, "/") != 3 {
		t.Fatalf("namespace %q is not under %s", ns, EnvPrefix)
	}
	for _, bad := range []struct{ env, value string }{
		{EnvPrefix, "/no-slash"}, {EnvPrefix, "/"}, {EnvUser, "only-user"}, {EnvCert, "/only/cert.pem"},
		{EnvCACert, "/does/not/exist.pem"},
	} {
		t.Run(bad.env, func(t *testing.T) {
			t.Setenv(bad.env, bad.value)
			if s, err := StartMain(); err == nil {
				s.Close()
				t.Fatalf("%s=%q accepted", bad.env, bad.value)
			}
		})
	}
	failFast(t)
	t.Setenv(EnvEndpoints, "127.0.0.1:1")
	if s, err := StartMain(); err == nil {
		s.Close()
		t.Fatal("an unreachable cluster was accepted")
	}
}

func TestExternalTLSAndAuth(t *testing.T) {
	ctx := context.Background()
	certs := testcerts.New(t)
	sec := StartSecure(t, TLS{CertFile: certs.Server.CertFile, KeyFile: certs.Server.KeyFile,
		TrustedCAFile: certs.CA.CertFile, ClientCertAuth: true})
	tlsCfg, err := ClientTLS(certs.Client.CertFile, certs.Client.KeyFile, certs.CA.CertFile)
	if err != nil {
		t.Fatal(err)
	}
	cfg := sec.Config()
	cfg.TLS = tlsCfg
	admin, err := clientv3.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = admin.Close() }()
	if err := AddPrefixUser(ctx, admin, "checker", "secret", "/check/"); err != nil {
		t.Fatal(err)
	}
	if err := EnableAuth(ctx, admin, "root-secret"); err != nil {
		t.Fatal(err)
	}
	asExternal(t, sec)
	t.Setenv(EnvCACert, certs.CA.CertFile)
	t.Setenv(EnvCert, certs.Client.CertFile)
	t.Setenv(EnvKey, certs.Client.KeyFile)
	t.Setenv(EnvUser, "checker")
	t.Setenv(EnvPassword, "secret")
	t.Setenv(EnvPrefix, "/check/")

	ext := Start(t)
	c := ext.Client(t)
	ns := Namespace()
	if _, err := c.Put(ctx, ns+"k", "v"); err != nil {
		t.Fatalf("put as checker: %v", err)
	}
	if g, err := c.Get(ctx, ns+"k"); err != nil || len(g.Kvs) != 1 {
		t.Fatalf("get as checker: %v %v", g, err)
	}

	// the connection check catches a wrong password and a missing client
	// certificate
	failFast(t)
	t.Setenv(EnvPassword, "wrong")
	if s, err := StartMain(); err == nil {
		s.Close()
		t.Fatal("a wrong password was accepted")
	}
	t.Setenv(EnvPassword, "secret")
	t.Setenv(EnvCert, "")
	t.Setenv(EnvKey, "")
	if s, err := StartMain(); err == nil {
		s.Close()
		t.Fatal("a connection without the client certificate was accepted")
	}
}
