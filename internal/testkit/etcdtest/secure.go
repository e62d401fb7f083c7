package etcdtest

import (
	"context"
	"crypto/tls"
	"fmt"
	"testing"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TLS configures the client listener of a server started by StartSecure.
type TLS struct {
	// CertFile and KeyFile are the server's certificate and key.
	CertFile, KeyFile string
	// TrustedCAFile is the CA client certificates must be signed by.
	TrustedCAFile string
	// ClientCertAuth makes the server require a client certificate signed
	// by TrustedCAFile.
	ClientCertAuth bool
}

// StartSecure starts an embedded server like Start (always embedded, even
// when External) whose client listener speaks TLS (when tlsInfo.CertFile is
// set), and registers its Close with t.Cleanup.
// Password hashing uses bcrypt's minimum cost, so authenticating is fast.
// Its Config has no TLS: use ClientTLS for the client side.
func StartSecure(t testing.TB, tlsInfo TLS, opts ...Option) *Server {
	t.Helper()
	o := applyOptions(opts)
	if o.dir == "" {
		o.dir = t.TempDir()
	}
	s, err := startSecure(o, tlsInfo)
	if err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

func startSecure(o options, tlsInfo TLS) (*Server, error) {
	scheme := "http"
	if tlsInfo.CertFile != "" {
		scheme = "https"
	}
	cfg := embedConfig(o, scheme)
	cfg.BcryptCost = 4 // bcrypt.MinCost
	cfg.ClientTLSInfo = transport.TLSInfo{
		CertFile: tlsInfo.CertFile, KeyFile: tlsInfo.KeyFile,
		TrustedCAFile: tlsInfo.TrustedCAFile, ClientCertAuth: tlsInfo.ClientCertAuth,
	}
	return launch(cfg)
}

// ClientTLS returns the client TLS configuration trusting caFile and, when
// certFile is set, presenting that certificate.
func ClientTLS(certFile, keyFile, caFile string) (*tls.Config, error) {
	info := transport.TLSInfo{CertFile: certFile, KeyFile: keyFile, TrustedCAFile: caFile}
	return info.ClientConfig()
}

// EnableAuth creates the root user (password rootPassword, role root) and
// turns authentication on. c must be allowed to do so: a client of a server
// without authentication.
func EnableAuth(ctx context.Context, c *clientv3.Client, rootPassword string) error {
	if _, err := c.UserAdd(ctx, "root", rootPassword); err != nil {
		return fmt.Errorf("add root user: %w", err)
	}
	if _, err := c.UserGrantRole(ctx, "root", "root"); err != nil {
		return fmt.Errorf("grant root role: %w", err)
	}
	if _, err := c.AuthEnable(ctx); err != nil {
		return fmt.Errorf("enable auth: %w", err)
	}
	return nil
}

// AddPrefixUser creates user name with password (empty: a user that can
// only authenticate with a client certificate of that common name) and a
// role of the same name granting read and write on every key starting with
// prefix, and nothing else.
func AddPrefixUser(ctx context.Context, c *clientv3.Client, name, password, prefix string) error {
	if password == "" {
		if _, err := c.UserAddWithOptions(ctx, name, "", &clientv3.UserAddOptions{NoPassword: true}); err != nil {
			return fmt.Errorf("add user %s: %w", name, err)
		}
	} else if _, err := c.UserAdd(ctx, name, password); err != nil {
		return fmt.Errorf("add user %s: %w", name, err)
	}
	if _, err := c.RoleAdd(ctx, name); err != nil {
		return fmt.Errorf("add role %s: %w", name, err)
	}
	if _, err := c.RoleGrantPermission(ctx, name, prefix, clientv3.GetPrefixRangeEnd(prefix), clientv3.PermissionType(clientv3.PermReadWrite)); err != nil {
		return fmt.Errorf("grant %s on %q: %w", name, prefix, err)
	}
	if _, err := c.UserGrantRole(ctx, name, name); err != nil {
		return fmt.Errorf("grant role %s: %w", name, err)
	}
	return nil
}
