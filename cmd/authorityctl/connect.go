package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"

	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// tlsConfig builds the TLS settings of the flags (nil: plain text). Errors
// name the file at fault.
func (g *globals) tlsConfig() (*tls.Config, error) {
	if g.cacert == "" && g.cert == "" {
		return nil, nil
	}
	t := &tls.Config{MinVersion: tls.VersionTLS12}
	if g.cacert != "" {
		pem, err := os.ReadFile(g.cacert)
		if err != nil {
			return nil, fmt.Errorf("TLS: cannot read --cacert file %q: %w", g.cacert, err)
		}
		t.RootCAs = x509.NewCertPool()
		if !t.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("TLS: --cacert file %q holds no PEM certificate", g.cacert)
		}
	}
	if g.cert != "" {
		certPEM, err := os.ReadFile(g.cert)
		if err != nil {
			return nil, fmt.Errorf("TLS: cannot read --cert file %q: %w", g.cert, err)
		}
		keyPEM, err := os.ReadFile(g.key)
		if err != nil {
			return nil, fmt.Errorf("TLS: cannot read --key file %q: %w", g.key, err)
		}
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, fmt.Errorf("TLS: --cert %q and --key %q are not a usable key pair: %w", g.cert, g.key, err)
		}
		t.Certificates = []tls.Certificate{pair}
	}
	return t, nil
}

// credentials returns the user name and password of --user, --password
// and AUTHORITYCTL_PASSWORD ("name:password" in --user also works).
func (g *globals) credentials() (string, string) {
	user, password := g.user, g.password
	if name, pw, ok := strings.Cut(user, ":"); ok && password == "" {
		user, password = name, pw
	}
	return user, password
}

// dial connects to the endpoints and checks, within --dial-timeout, that at
// least one answers. It returns the client and each reachable endpoint's
// status (nil for unreachable ones, with its error).
func (g *globals) dial(ctx context.Context) (*clientv3.Client, []endpointStatus, error) {
	t, err := g.tlsConfig()
	if err != nil {
		return nil, nil, connectError(err)
	}
	user, password := g.credentials()
	c, err := clientv3.New(clientv3.Config{
		Endpoints:          g.endpoints,
		DialTimeout:        g.dialTimeout,
		TLS:                t,
		Username:           user,
		Password:           password,
		Logger:             zap.NewNop(),
		MaxCallSendMsgSize: 4 * 1024 * 1024,
		MaxCallRecvMsgSize: 64 * 1024 * 1024,
	})
	if err != nil {
		return nil, nil, connectError(fmt.Errorf("cannot connect to etcd at %s: %w", strings.Join(g.endpoints, ","), err))
	}
	statuses := g.probe(ctx, c)
	var failures []string
	var authErr error
	for _, s := range statuses {
		if s.err == nil {
			return c, statuses, nil
		}
		if isAuthError(s.err) {
			authErr = s.err
		}
		failures = append(failures, fmt.Sprintf("%s: %v", s.endpoint, s.err))
	}
	_ = c.Close()
	if authErr != nil {
		return nil, nil, connectError(fmt.Errorf("etcd refused the credentials of user %q: %w", user, authErr))
	}
	hint := ""
	if t != nil {
		hint = " (TLS is on: check that the server speaks TLS and trusts --cert/--key, and that --cacert signed its certificate)"
	}
	return nil, nil, connectError(fmt.Errorf("cannot reach etcd within --dial-timeout %s: %s%s", g.dialTimeout, strings.Join(failures, "; "), hint))
}

func isAuthError(err error) bool {
	for _, e := range []error{rpctypes.ErrAuthFailed, rpctypes.ErrPermissionDenied, rpctypes.ErrInvalidAuthToken,
		rpctypes.ErrUserEmpty, rpctypes.ErrUserNotFound, rpctypes.ErrAuthNotEnabled} {
		if errors.Is(err, e) {
			return true
		}
	}
	return strings.Contains(err.Error(), "authentication failed")
}

// endpointStatus is one endpoint's answer to Status.
type endpointStatus struct {
	endpoint string
	status   *clientv3.StatusResponse
	err      error
}

// probe asks every endpoint for its status in parallel, each within
// --dial-timeout.
func (g *globals) probe(ctx context.Context, c *clientv3.Client) []endpointStatus {
	out := make([]endpointStatus, len(g.endpoints))
	var wg sync.WaitGroup
	for i, ep := range g.endpoints {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pctx, cancel := context.WithTimeout(ctx, g.dialTimeout)
			defer cancel()
			st, err := c.Status(pctx, ep)
			if err != nil && pctx.Err() != nil && ctx.Err() == nil {
				err = fmt.Errorf("no answer within %s", g.dialTimeout)
			}
			out[i] = endpointStatus{endpoint: ep, status: st, err: err}
		}()
	}
	wg.Wait()
	return out
}

// store opens the provider's store on a dialled client; close releases both.
func (g *globals) store(ctx context.Context) (*etcdstore.Store, *clientv3.Client, func(), error) {
	c, _, err := g.dial(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	s, err := etcdstore.New(ctx, etcdstore.Config{Client: c, Namespace: g.namespace})
	if err != nil {
		_ = c.Close()
		return nil, nil, nil, err
	}
	return s, c, func() { _ = s.Close(); _ = c.Close() }, nil
}
