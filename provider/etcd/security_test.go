package etcd_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	"github.com/zlink-systems/authority/internal/testkit/testcerts"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The security tests run their own embedded servers: one with TLS client
// certificates, one with username/password authentication.

// refusedWithin bounds New against a server that refuses the connection: the
// client does not say why it cannot connect, it waits for its context.
const refusedWithin = 500 * time.Millisecond

// dialWithin bounds New when it should succeed.
const dialWithin = 10 * time.Second

// dialStore returns a store dialled with cfg on srv (its endpoint filled in),
// closed at t's cleanup.
func dialStore(t *testing.T, srv *etcdtest.Server, cfg etcdstore.Config, within time.Duration) (*etcdstore.Store, error) {
	t.Helper()
	cfg.Endpoints = []string{srv.Endpoint()}
	if cfg.Clock == nil {
		cfg.Clock = authority.NewManualClock(testEpoch)
	}
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	s, err := etcdstore.New(ctx, cfg)
	if err == nil {
		t.Cleanup(func() { _ = s.Close() })
	}
	return s, err
}

// mustDial is dialStore failing t on error.
func mustDial(t *testing.T, srv *etcdtest.Server, cfg etcdstore.Config) *etcdstore.Store {
	t.Helper()
	s, err := dialStore(t, srv, cfg, dialWithin)
	require.NoError(t, err)
	return s
}

// workload drives s through every operation family, so every key family of
// its namespace is read and written: owner liveness and generations, rows,
// capacity entries, reservation and creation terminals, aggregates, blobs,
// owner indexes, paging cursors and watches. It fails t on any error.
func workload(t *testing.T, s *etcdstore.Store) {
	t.Helper()
	clock := authority.NewManualClock(testEpoch)
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	ctx := fx.Ctx()

	// a Spot: reserve, commit, read, CAS put
	spot := fx.Reserve(authority.ObjectUserSpot, "spot-1", conformance.TargetA)
	ready := fx.MustCommit(spot, []byte("ready"))
	require.Equal(t, []byte("ready"), fx.MustRow(spot.Key).Payload)
	fx.Put(spot.Key, ready.StoreVersion, []byte("v2"))

	// an Actor completed with a terminal, one aborted, one with a global ID
	// that looks like a path out of the namespace
	actor := fx.Reserve(authority.ObjectActor, "actor-1", conformance.TargetA)
	pub := fx.Publication()
	fx.MustComplete(actor, authority.TerminalCreated, []byte("created"), pub)
	term, err := s.ReadCreationTerminal(ctx, pub.Operation)
	require.NoError(t, err)
	require.Equal(t, authority.KindFound, term.Kind)
	aborted := fx.Reserve(authority.ObjectActor, "actor-2", conformance.TargetA)
	ab, err := s.Abort(ctx, aborted.AbortRequest())
	require.NoError(t, err)
	require.Equal(t, authority.KindAborted, ab.Kind)
	escape := fx.Reserve(authority.ObjectActor, "../../../v0/rows/actor/actor-1", conformance.TargetA)
	fx.MustComplete(escape, authority.TerminalCreated, []byte("escaped?"), fx.Publication())

	// an aggregate moving actor-1 to TargetB
	a1 := fx.MustRow(actor.Key)
	fence := fx.MustPrepare(conformance.AggregateRequest("agg-1", 1, conformance.TargetB, authority.CapacityVector{Actors: 1},
		conformance.Participant(actor.Key, a1.StoreVersion, authority.TransitionNewOwner, []byte("moved"))))
	ca, err := s.CommitAggregate(ctx, fence)
	require.NoError(t, err)
	require.Equal(t, authority.KindCommitted, ca.Kind)
	require.Equal(t, conformance.OwnerB.OwnerID, fx.MustRow(actor.Key).OwnerID)

	// capacity, paging with a cursor, a watch
	require.Equal(t, int64(1), fx.ActorUsage(conformance.NodeA).Active)
	require.Len(t, fx.ListAll("", 1), 3)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, s.WaitForChange(wctx, spot.Key, ready.StoreVersion), "the row changed since ready")

	// a relocation blob
	rel := s.Relocation()
	receipt, err := rel.PutNew(ctx, []byte("blob"), time.Hour)
	require.NoError(t, err)
	got, err := rel.Read(ctx, receipt.Reference)
	require.NoError(t, err)
	require.Equal(t, authority.KindFound, got.Kind)
	require.NoError(t, rel.Delete(ctx, receipt.Reference))

	// an owner lease generation, then removal of an owner's rows
	lease, err := s.Registry().Acquire(ctx, conformance.NodeA, conformance.NodeLifecycle, "owner-c", time.Minute)
	require.NoError(t, err)
	require.NoError(t, lease.Close(ctx))
	n, err := s.RemoveAllByOwner(ctx, conformance.OwnerA)
	require.NoError(t, err)
	require.Equal(t, int64(2), n, "spot-1 and the escape-looking actor")
}

func TestSecurityTLSClientCertificates(t *testing.T) {
	certs := testcerts.New(t)
	srv := etcdtest.StartSecure(t, etcdtest.TLS{
		CertFile: certs.Server.CertFile, KeyFile: certs.Server.KeyFile,
		TrustedCAFile: certs.CA.CertFile, ClientCertAuth: true,
	})
	good := etcdstore.Config{CAFile: certs.CA.CertFile, CertFile: certs.Client.CertFile, KeyFile: certs.Client.KeyFile}

	t.Run("RightCertificates", func(t *testing.T) {
		workload(t, mustDial(t, srv, good))
	})

	t.Run("Refused", func(t *testing.T) {
		expired, err := certs.CA.Issue(testcerts.Client, "expired", testcerts.Expired())
		require.NoError(t, err)
		for _, tc := range []struct {
			name  string
			cfg   etcdstore.Config
			cause string // what the error must name
		}{
			{"ClientCertificateOfAnotherCA", etcdstore.Config{CAFile: certs.CA.CertFile, CertFile: certs.OtherClient.CertFile, KeyFile: certs.OtherClient.KeyFile}, "unknown certificate authority"},
			{"ExpiredClientCertificate", etcdstore.Config{CAFile: certs.CA.CertFile, CertFile: expired.CertFile, KeyFile: expired.KeyFile}, "expired"},
			{"NoClientCertificate", etcdstore.Config{CAFile: certs.CA.CertFile}, "certificate required"},
			{"WrongCA", etcdstore.Config{CAFile: certs.OtherCA.CertFile, CertFile: certs.Client.CertFile, KeyFile: certs.Client.KeyFile}, "unknown authority"},
			{"NoTLS", etcdstore.Config{}, "requires TLS"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				_, err := dialStore(t, srv, tc.cfg, refusedWithin)
				require.Error(t, err)
				require.True(t, errors.Is(err, authority.ErrAccessDenied) || errors.Is(err, authority.ErrUnavailable),
					"want ErrAccessDenied or ErrUnavailable, got %v", err)
				require.False(t, errors.Is(err, authority.ErrOutcomeUnknown), "nothing was written: %v", err)
				require.Contains(t, err.Error(), tc.cause)
				require.NotContains(t, err.Error(), "deadline exceeded", "the cause, not the timeout")
			})
		}
	})

	t.Run("BadFiles", func(t *testing.T) {
		dir := t.TempDir()
		missing := filepath.Join(dir, "no-such-client.pem")
		notPEM := filepath.Join(dir, "not-a-certificate.pem")
		require.NoError(t, os.WriteFile(notPEM, []byte("hello"), 0o600))
		for _, tc := range []struct {
			name, file string
			cfg        etcdstore.Config
		}{
			{"MissingCertFile", missing, etcdstore.Config{CAFile: certs.CA.CertFile, CertFile: missing, KeyFile: certs.Client.KeyFile}},
			{"MissingKeyFile", missing, etcdstore.Config{CAFile: certs.CA.CertFile, CertFile: certs.Client.CertFile, KeyFile: missing}},
			{"MissingCAFile", missing, etcdstore.Config{CAFile: missing, CertFile: certs.Client.CertFile, KeyFile: certs.Client.KeyFile}},
			{"CAFileWithoutCertificate", "CA file", etcdstore.Config{CAFile: notPEM}},
			{"KeyOfAnotherCertificate", "certificate", etcdstore.Config{CAFile: certs.CA.CertFile, CertFile: certs.Client.CertFile, KeyFile: certs.OtherClient.KeyFile}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				_, err := dialStore(t, srv, tc.cfg, dialWithin)
				require.ErrorIs(t, err, authority.ErrInvalidArgument)
				require.Contains(t, err.Error(), tc.file, "the error names what is wrong")
			})
		}
	})

	// With authentication on, etcd takes the user from the client
	// certificate's common name: a user whose role grants only the
	// namespace's prefix works with the certificate alone.
	t.Run("CertificateCommonNameAsUser", func(t *testing.T) {
		tlsCfg, err := etcdtest.ClientTLS(certs.Server.CertFile, certs.Server.KeyFile, certs.CA.CertFile)
		require.NoError(t, err)
		ccfg := srv.Config()
		ccfg.TLS = tlsCfg
		admin, err := clientv3.New(ccfg)
		require.NoError(t, err)
		defer admin.Close()
		ctx := context.Background()
		require.NoError(t, etcdtest.AddPrefixUser(ctx, admin, "client", "", "/tenant-cn/"))
		require.NoError(t, etcdtest.EnableAuth(ctx, admin, "root-password"))
		cfg := good
		cfg.Namespace = "/tenant-cn/a/"
		workload(t, mustDial(t, srv, cfg))
		cfg.Namespace = "/tenant-other/"
		_, err = dialStore(t, srv, cfg, dialWithin)
		require.ErrorIs(t, err, authority.ErrAccessDenied)
		require.Contains(t, err.Error(), `the etcd user of the client certificate (its common name) lacks read permission on the namespace prefix "/tenant-other/"`)
	})
}

// authServer is an embedded server with authentication on: root, plus a
// user per tenant whose role grants only its tenant prefix.
type authServer struct {
	*etcdtest.Server
	root *clientv3.Client
}

const rootPassword = "root-password"

func startAuthServer(t *testing.T, tenants map[string]string) *authServer {
	t.Helper()
	srv := etcdtest.StartSecure(t, etcdtest.TLS{})
	ctx := context.Background()
	c := srv.Client(t)
	for user, prefix := range tenants {
		require.NoError(t, etcdtest.AddPrefixUser(ctx, c, user, user+"-password", prefix))
	}
	require.NoError(t, etcdtest.EnableAuth(ctx, c, rootPassword))
	cfg := srv.Config()
	cfg.Username, cfg.Password = "root", rootPassword
	root, err := clientv3.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = root.Close() })
	return &authServer{srv, root}
}

func TestSecurityPasswordAuth(t *testing.T) {
	srv := startAuthServer(t, map[string]string{"tenant-a": "/tenant-a/", "tenant-b": "/tenant-b/"})
	ctx := context.Background()

	t.Run("RightCredentials", func(t *testing.T) {
		workload(t, mustDial(t, srv.Server, etcdstore.Config{Username: "root", Password: rootPassword, Namespace: "/root-ns/"}))
	})

	t.Run("RefusedCredentials", func(t *testing.T) {
		for _, tc := range []struct{ name, user, password string }{
			{"WrongPassword", "root", "not-the-password"},
			{"UnknownUser", "nobody", "password"},
			{"NoCredentials", "", ""},
		} {
			t.Run(tc.name, func(t *testing.T) {
				_, err := dialStore(t, srv.Server, etcdstore.Config{Username: tc.user, Password: tc.password}, dialWithin)
				require.ErrorIs(t, err, authority.ErrAccessDenied)
				require.Contains(t, err.Error(), "credentials")
			})
		}
	})

	// A user whose role grants only the tenant prefix runs the whole
	// workload: the provider never touches a key outside its namespace.
	t.Run("PrefixRoleSuffices", func(t *testing.T) {
		workload(t, mustDial(t, srv.Server, etcdstore.Config{Username: "tenant-a", Password: "tenant-a-password", Namespace: "/tenant-a/ns-1/"}))
	})

	// New names the user, the permission it lacks and the prefix when the
	// role does not cover the namespace, and writes nothing.
	t.Run("NewChecksTheNamespaceAccess", func(t *testing.T) {
		const ns = "/tenant-a/ns-3/"
		_, err := dialStore(t, srv.Server, etcdstore.Config{Username: "tenant-b", Password: "tenant-b-password", Namespace: ns}, dialWithin)
		require.ErrorIs(t, err, authority.ErrAccessDenied)
		require.Contains(t, err.Error(), `etcd user "tenant-b" lacks read permission on the namespace prefix "/tenant-a/ns-3/"`)
		// a role that may only read the namespace
		_, err = srv.root.RoleAdd(ctx, "reader")
		require.NoError(t, err)
		_, err = srv.root.RoleGrantPermission(ctx, "reader", "/tenant-a/", clientv3.GetPrefixRangeEnd("/tenant-a/"), clientv3.PermissionType(clientv3.PermRead))
		require.NoError(t, err)
		_, err = srv.root.UserAdd(ctx, "reader", "reader-password")
		require.NoError(t, err)
		_, err = srv.root.UserGrantRole(ctx, "reader", "reader")
		require.NoError(t, err)
		_, err = dialStore(t, srv.Server, etcdstore.Config{Username: "reader", Password: "reader-password", Namespace: ns}, dialWithin)
		require.ErrorIs(t, err, authority.ErrAccessDenied)
		require.Contains(t, err.Error(), `etcd user "reader" lacks readwrite permission on the namespace prefix "/tenant-a/ns-3/"`)
		// a read-only store needs no more than that role, and grants no lease
		leasesBefore := leaseIDs(t, srv.root)
		ro := mustDial(t, srv.Server, etcdstore.Config{Username: "reader", Password: "reader-password", Namespace: ns, ReadOnly: true})
		page, err := ro.ListAuthorities(ctx, "", "", 10)
		require.NoError(t, err)
		require.Empty(t, page.Items)
		require.Equal(t, leasesBefore, leaseIDs(t, srv.root), "a read-only store granted a lease")
		resp, err := srv.root.Get(ctx, ns, clientv3.WithPrefix(), clientv3.WithCountOnly())
		require.NoError(t, err)
		require.Zero(t, resp.Count, "nothing written in the namespace")
	})

	// A user of another prefix is refused at New, and a store whose
	// permission is revoked once it runs is refused every read and write.
	t.Run("OtherPrefixRoleDenied", func(t *testing.T) {
		const ns = "/tenant-a/ns-2/"
		cfg := etcdstore.Config{Username: "tenant-b", Password: "tenant-b-password", Namespace: ns}
		// New reads the namespace's store version: it is refused at once,
		// and leaves no lease behind
		leasesBefore := leaseIDs(t, srv.root)
		_, err := dialStore(t, srv.Server, cfg, dialWithin)
		require.ErrorIs(t, err, authority.ErrAccessDenied)
		require.Equal(t, leasesBefore, leaseIDs(t, srv.root), "a refused New left a lease")
		// a store whose permission is revoked once it runs is refused every
		// request
		_, err = srv.root.RoleGrantPermission(ctx, "tenant-b", ns, clientv3.GetPrefixRangeEnd(ns), clientv3.PermissionType(clientv3.PermReadWrite))
		require.NoError(t, err)
		s := mustDial(t, srv.Server, cfg)
		_, err = srv.root.RoleRevokePermission(ctx, "tenant-b", ns, clientv3.GetPrefixRangeEnd(ns))
		require.NoError(t, err)
		opened, err := srv.root.Get(ctx, ns, clientv3.WithPrefix(), clientv3.WithCountOnly())
		require.NoError(t, err)
		leasesBefore = leaseIDs(t, srv.root)
		fx := conformance.Fixture{T: t, H: harnessFor(s, authority.NewManualClock(testEpoch))}
		key := fx.Key(authority.ObjectActor, "a1")
		_, err = s.ReadAuthority(ctx, key)
		require.ErrorIs(t, err, authority.ErrAccessDenied)
		_, err = s.Reserve(ctx, fx.ReserveRequest(authority.ObjectActor, "a1", conformance.TargetA))
		require.ErrorIs(t, err, authority.ErrAccessDenied)
		_, err = s.ListAuthorities(ctx, "", "", 10)
		require.ErrorIs(t, err, authority.ErrAccessDenied)
		err = s.MarkLive(ctx, conformance.NodeA, 1, conformance.OwnerA, time.Minute)
		require.ErrorIs(t, err, authority.ErrAccessDenied)
		_, err = s.Registry().Acquire(ctx, conformance.NodeA, 1, "owner-x", time.Minute)
		require.ErrorIs(t, err, authority.ErrAccessDenied)
		err = s.WaitForChange(ctx, key, "")
		require.ErrorIs(t, err, authority.ErrAccessDenied)
		for range 3 {
			_, err = s.Relocation().PutNew(ctx, []byte("blob"), time.Hour)
			require.ErrorIs(t, err, authority.ErrAccessDenied)
		}
		resp, err := srv.root.Get(ctx, ns, clientv3.WithPrefix(), clientv3.WithCountOnly())
		require.NoError(t, err)
		require.Equal(t, opened.Count, resp.Count, "nothing written in the namespace")
		// MarkLive and Acquire revoke the lease they granted; the refused
		// blob puts share one expiry bucket lease (it expires with the
		// bucket, and later puts of the bucket reuse it).
		var left []clientv3.LeaseID
		for id := range leaseIDs(t, srv.root) {
			if !leasesBefore[id] {
				left = append(left, id)
				ttl, err := srv.root.TimeToLive(ctx, id, clientv3.WithAttachedKeys())
				require.NoError(t, err)
				require.Empty(t, ttl.Keys)
				require.LessOrEqual(t, ttl.TTL, int64((time.Hour + 2*time.Minute).Seconds()), "the bucket lease outlives its blobs' bucket")
			}
		}
		require.LessOrEqual(t, len(left), 1, "refused requests left leases behind: %x", left)
	})
}

// TestNamespaceIsolationAroundPrefix runs the workload in the default
// namespace (with full access) next to foreign keys that share prefixes with
// it and next to two sibling namespaces running the same workload, and checks
// that every key outside the namespace is exactly as before.
func TestNamespaceIsolationAroundPrefix(t *testing.T) {
	srv := startAuthServer(t, nil)
	ctx := context.Background()
	root := etcdstore.Config{Username: "root", Password: rootPassword}
	ns := etcdstore.DefaultNamespace // "/zlink/authority/v1/"
	siblings := []string{"/zlink/authority/v1-sibling/", "/zlink/authority/v1_sibling/"}
	foreign := []string{
		"/zlink/authority/v0", "/zlink/authority/v0/", "/zlink/authority/v0/rows/actor/actor-1",
		strings.TrimSuffix(ns, "/"), strings.TrimSuffix(ns, "/") + "\x00", ns[:len(ns)-1] + ".",
		strings.TrimSuffix(ns, "/") + "\xff", "/zlink/authority/v10/rows/actor/actor-1", "/zlink/authority/v2/",
		"/zlink/authority/", "/zlink/", "zlink/authority/v1/rows/actor/actor-1", "\x00", "\xff\xff",
		ns[:len(ns)-1] + "0/owners/owner-a",
	}
	for i, k := range foreign {
		_, err := srv.root.Put(ctx, k, "foreign-"+string(rune('a'+i)))
		require.NoError(t, err)
	}
	for _, sib := range siblings {
		cfg := root
		cfg.Namespace = sib
		workload(t, mustDial(t, srv.Server, cfg))
	}
	before := outside(t, srv.root, ns)
	require.Greater(t, len(before), len(foreign)+2*5, "the siblings left rows and records")

	s := mustDial(t, srv.Server, root)
	require.Equal(t, ns, s.Namespace())
	workload(t, s)
	inside, err := srv.root.Get(ctx, ns, clientv3.WithPrefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	require.NotZero(t, inside.Count, "the workload wrote in its namespace")
	after := outside(t, srv.root, ns)
	require.Equal(t, len(before), len(after), "keys outside the namespace added or removed")
	for i := range before {
		b, a := before[i], after[i]
		require.Equal(t, string(b.Key), string(a.Key))
		require.True(t, bytes.Equal(b.Value, a.Value) && b.ModRevision == a.ModRevision, "key %q rewritten", b.Key)
	}

	// a cursor of another namespace, on the same server, is refused
	sib := mustDial(t, srv.Server, etcdstore.Config{Username: "root", Password: rootPassword, Namespace: siblings[0]})
	sfx := conformance.NewFixture(t, harnessFor(sib, authority.NewManualClock(testEpoch)))
	sfx.Active(authority.ObjectUserSpot, "more-1", conformance.TargetA)
	sfx.Active(authority.ObjectUserSpot, "more-2", conformance.TargetA)
	page, err := sib.ListAuthorities(ctx, "", "", 1)
	require.NoError(t, err)
	require.NotEmpty(t, page.NextCursor)
	_, err = s.ListAuthorities(ctx, "", page.NextCursor, 1)
	require.ErrorIs(t, err, authority.ErrInvalidArgument)
	pos, err := authority.ParseScanCursor(page.NextCursor)
	require.NoError(t, err)
	for name, p := range map[string]authority.ScanPosition{
		"scope without slash": {Scope: strings.TrimSuffix(ns, "/"), Prefix: "", Revision: pos.Revision, After: pos.After},
		"parent scope":        {Scope: "/zlink/authority/", Prefix: "", Revision: pos.Revision, After: pos.After},
		"future revision":     {Scope: ns, Prefix: "", Revision: pos.Revision + 1_000_000, After: pos.After},
	} {
		_, err = s.ListAuthorities(ctx, "", authority.EncodeScanCursor(p), 1)
		require.ErrorIs(t, err, authority.ErrInvalidArgument, name)
	}
	// a blob reference of another namespace names nothing here
	blob, err := sib.Relocation().PutNew(ctx, []byte("sibling blob"), time.Hour)
	require.NoError(t, err)
	for _, ref := range []authority.BlobReference{blob.Reference, "../../v1-sibling/blobs/" + blob.Reference} {
		got, err := s.Relocation().Read(ctx, ref)
		require.NoError(t, err)
		require.Equal(t, authority.KindMissing, got.Kind, "reference %q", ref)
	}
}

// outside returns every key of the server outside ns, in key order.
func outside(t *testing.T, c *clientv3.Client, ns string) []*mvccpb.KeyValue {
	t.Helper()
	ctx := context.Background()
	resp, err := c.Get(ctx, "\x00", clientv3.WithFromKey())
	require.NoError(t, err)
	var out []*mvccpb.KeyValue
	for _, kv := range resp.Kvs {
		if !strings.HasPrefix(string(kv.Key), ns) {
			out = append(out, kv)
		}
	}
	return out
}

// leaseIDs returns the leases of the server.
func leaseIDs(t *testing.T, c *clientv3.Client) map[clientv3.LeaseID]bool {
	t.Helper()
	resp, err := c.Leases(context.Background())
	require.NoError(t, err)
	out := map[clientv3.LeaseID]bool{}
	for _, l := range resp.Leases {
		out[l.ID] = true
	}
	return out
}
