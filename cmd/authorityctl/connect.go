package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"

	authority "github.com/zlink-systems/authority"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/preflight"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// tlsConfig builds the TLS settings of the flags (nil: plain text) with the
// provider's preflight.ClientTLS. Errors name the flag and file at fault.
func (g *globals) tlsConfig() (*tls.Config, error) {
	t, err := preflight.ClientTLS(g.cacert, g.cert, g.key)
	var fe *preflight.TLSFileError
	if err == nil || !errors.As(err, &fe) {
		return t, err
	}
	flag := map[preflight.TLSFile]string{preflight.TLSFileCA: "--cacert", preflight.TLSFileCert: "--cert", preflight.TLSFileKey: "--key"}[fe.File]
	switch fe.Problem {
	case preflight.TLSNoCertificate:
		return nil, fmt.Errorf("TLS: %s file %q holds no PEM certificate", flag, fe.Path)
	case preflight.TLSNotAKeyPair:
		return nil, fmt.Errorf("TLS: --cert %q and --key %q are not a usable key pair: %w", g.cert, g.key, fe.Err)
	case preflight.TLSUnreadable:
		return nil, fmt.Errorf("TLS: cannot read %s file %q: %w", flag, fe.Path, fe.Err)
	}
	return nil, fmt.Errorf("TLS: %s: %w", flag, err)
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

// dial connects to the endpoints. It first opens a TCP connection to each
// endpoint in parallel (a refused port or an unknown host fails at once and
// is named), then asks the reachable ones for their status within
// --dial-timeout. With all it waits for every endpoint's answer (doctor);
// otherwise it returns at the first endpoint that answers, warning on stderr
// about the endpoints that could not be reached. It returns the client and
// each endpoint's status (nil with its error for a failed one, nil without
// error for one not asked).
func (g *globals) dial(ctx context.Context, all bool) (*clientv3.Client, []endpointStatus, error) {
	t, err := g.tlsConfig()
	if err != nil {
		return nil, nil, connectError(err)
	}
	statuses := g.reach(ctx)
	if err := g.interrupted(ctx, "connecting"); err != nil {
		return nil, nil, err
	}
	var live []string
	for _, s := range statuses {
		if s.err == nil {
			live = append(live, s.endpoint)
		}
	}
	if len(live) == 0 {
		return nil, nil, connectError(fmt.Errorf("cannot reach etcd: %s", failures(statuses)))
	}
	user, password := g.credentials()
	c, err := clientv3.New(clientv3.Config{
		Endpoints:          live,
		DialTimeout:        g.dialTimeout,
		TLS:                t,
		Username:           user,
		Password:           password,
		Logger:             zap.NewNop(),
		MaxCallSendMsgSize: max(4*1024*1024, g.sendLimit),
		MaxCallRecvMsgSize: 64 * 1024 * 1024,
	})
	if err != nil {
		return nil, nil, g.connectFailure(ctx, statuses, t, fmt.Errorf("cannot connect to etcd at %s: %w", strings.Join(live, ","), err))
	}
	g.probe(ctx, c, statuses, all)
	var answered []string
	for _, s := range statuses {
		if s.err == nil && s.status != nil {
			answered = append(answered, s.endpoint)
		}
	}
	if len(answered) > 0 {
		if len(answered) < len(statuses) {
			// requests go to the endpoints that answered, not to one that
			// would make each of them wait for --dial-timeout
			c.SetEndpoints(answered...)
			if !all {
				if f := failures(statuses); f != "" {
					fmt.Fprintf(g.stderr, "warning: using %s; %s\n", strings.Join(answered, ","), f)
				}
			}
		}
		return c, statuses, nil
	}
	_ = c.Close()
	return nil, nil, g.connectFailure(ctx, statuses, t, nil)
}

// connectFailure explains why no endpoint answered.
func (g *globals) connectFailure(ctx context.Context, statuses []endpointStatus, t *tls.Config, cause error) error {
	if err := g.interrupted(ctx, "connecting"); err != nil {
		return err
	}
	for _, s := range statuses {
		if s.err != nil && isAuthError(s.err) {
			user, _ := g.credentials()
			return connectError(fmt.Errorf("etcd refused the credentials of user %q: %w", user, s.err))
		}
	}
	// the client reports a TLS refusal as a timeout: a handshake says why
	for _, s := range statuses {
		if s.err == nil && s.status != nil {
			continue
		}
		if perr := preflight.ProbeEndpoint(ctx, s.endpoint, t); perr != nil {
			return connectError(perr)
		}
	}
	if cause != nil {
		return connectError(cause)
	}
	hint := ""
	if t != nil {
		hint = " (TLS is on: check that the server speaks TLS and trusts --cert/--key, and that --cacert signed its certificate)"
	}
	return connectError(fmt.Errorf("cannot reach etcd: %s%s", failures(statuses), hint))
}

// interrupted returns the error to report when ctx ended during what: the
// user's stop, or --command-timeout running out (not --dial-timeout).
func (g *globals) interrupted(ctx context.Context, what string) error {
	if ctx.Err() == nil {
		return nil
	}
	if cause := context.Cause(ctx); errors.Is(cause, errCommandTimeout) {
		return connectError(fmt.Errorf("--command-timeout %s ran out while %s to %s", g.commandTimeout, what, strings.Join(g.endpoints, ",")))
	}
	return ctx.Err()
}

// failures lists the failed endpoints with their causes.
func failures(statuses []endpointStatus) string {
	var out []string
	for _, s := range statuses {
		if s.err != nil {
			out = append(out, fmt.Sprintf("endpoint %s: %v", s.endpoint, s.err))
		}
	}
	return strings.Join(out, "; ")
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

// reach opens (and closes) a TCP connection to every endpoint in parallel,
// each within --dial-timeout, and returns each endpoint's error: "connection
// refused", "no such host" and the like arrive at once. Unix socket
// endpoints are left to the client.
func (g *globals) reach(ctx context.Context) []endpointStatus {
	out := make([]endpointStatus, len(g.endpoints))
	var wg sync.WaitGroup
	for i, ep := range g.endpoints {
		out[i].endpoint = ep
		network, addr := endpointAddress(ep)
		if network != "tcp" {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			dctx, cancel := context.WithTimeout(ctx, g.dialTimeout)
			defer cancel()
			conn, err := (&net.Dialer{}).DialContext(dctx, network, addr)
			switch {
			case err == nil:
				_ = conn.Close()
			case ctx.Err() != nil:
				out[i].err = ctx.Err()
			case dctx.Err() != nil:
				out[i].err = fmt.Errorf("no TCP connection within --dial-timeout %s (host down or port filtered)", g.dialTimeout)
			default:
				out[i].err = err
			}
		}()
	}
	wg.Wait()
	return out
}

// endpointAddress returns the network and address of an endpoint as
// clientv3 takes it ("host:port", "http://host:port", "unix://path").
func endpointAddress(ep string) (string, string) {
	scheme, rest, ok := strings.Cut(ep, "://")
	if !ok {
		return "tcp", ep
	}
	switch scheme {
	case "unix", "unixs":
		return "unix", rest
	}
	return "tcp", strings.TrimSuffix(rest, "/")
}

// probe asks the endpoints that took a TCP connection for their status in
// parallel, each within --dial-timeout. Without all it stops at the first
// answer and leaves the others unasked.
func (g *globals) probe(ctx context.Context, c *clientv3.Client, statuses []endpointStatus, all bool) {
	pctx, stop := context.WithCancel(ctx)
	defer stop()
	type answer struct {
		i   int
		st  *clientv3.StatusResponse
		err error
	}
	answers := make(chan answer, len(statuses))
	asked := 0
	for i, s := range statuses {
		if s.err != nil {
			continue
		}
		asked++
		go func() {
			sctx, cancel := context.WithTimeout(pctx, g.dialTimeout)
			defer cancel()
			st, err := c.Status(sctx, s.endpoint)
			if err != nil && sctx.Err() != nil && pctx.Err() == nil {
				err = fmt.Errorf("the TCP connection opened but no etcd answer came within --dial-timeout %s "+
					"(not an etcd client port, a TLS mismatch, or the member hangs)", g.dialTimeout)
			}
			answers <- answer{i, st, err}
		}()
	}
	for ; asked > 0; asked-- {
		a := <-answers
		if pctx.Err() != nil && a.err != nil {
			continue // left unasked
		}
		statuses[a.i].status, statuses[a.i].err = a.st, a.err
		if a.err == nil && !all {
			stop()
		}
	}
}

// store opens the provider's store on a dialled client; close releases both.
// Unless the command writes, the store is read-only (etcdstore.Config
// ReadOnly): opening it writes nothing, and it refuses every write. It is a
// shard member (etcdstore.Config ShardMember): its commands (prune, remove,
// upgrade finalize) work on the one namespace they are pointed at, which
// may be one shard of several, on purpose.
func (g *globals) store(ctx context.Context, writes bool) (*etcdstore.Store, *clientv3.Client, func(), error) {
	c, _, err := g.dial(ctx, false)
	if err != nil {
		return nil, nil, nil, err
	}
	// ShardMember: authorityctl may write one shard of a sharded namespace
	// directly (remove-owner, prune-epochs, upgrade finalize of each shard);
	// its writes carry no map revision, so they are not fenced on the map
	s, err := etcdstore.New(ctx, etcdstore.Config{Client: c, Namespace: g.namespace, Role: "authorityctl", ReadOnly: !writes, ShardMember: true})
	if err != nil {
		_ = c.Close()
		if errors.Is(err, authority.ErrAccessDenied) {
			err = connectError(err) // the user's role does not cover the namespace
		}
		return nil, nil, nil, err
	}
	return s, c, func() { _ = s.Close(); _ = c.Close() }, nil
}

// warnIfEmpty says on stderr when the namespace holds no key at all, for a
// read-only command that found nothing: a mistyped --namespace then shows.
// (Only then: etcd counts a limited range to its end.)
func (g *globals) warnIfEmpty(ctx context.Context, c *clientv3.Client) {
	resp, err := c.Get(ctx, g.namespace, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(1))
	if err == nil && len(resp.Kvs) == 0 {
		g.warnEmpty()
	}
}

// warnEmpty is warnIfEmpty's warning. The exit code stays the command's
// own: an empty namespace is a valid answer (a new deployment).
func (g *globals) warnEmpty() {
	fmt.Fprintf(g.stderr, "warning: namespace %s holds no keys at all: check --namespace (this command wrote nothing)\n", g.namespace)
}
