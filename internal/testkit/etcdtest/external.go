package etcdtest

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Environment variables naming an external cluster. Only EnvEndpoints is
// required; the others are read only when it is set.
const (
	// EnvEndpoints lists the cluster's client endpoints, comma-separated
	// (host:port, http://host:port or https://host:port).
	EnvEndpoints = "AUTHORITY_ETCD_ENDPOINTS"
	// EnvCACert is a PEM file of the CA that signed the servers' certificates.
	EnvCACert = "AUTHORITY_ETCD_CACERT"
	// EnvCert is the client certificate (PEM) for TLS client authentication.
	EnvCert = "AUTHORITY_ETCD_CERT"
	// EnvKey is the client certificate's private key (PEM).
	EnvKey = "AUTHORITY_ETCD_KEY"
	// EnvUser is the etcd user to authenticate as.
	EnvUser = "AUTHORITY_ETCD_USER"
	// EnvPassword is EnvUser's password.
	EnvPassword = "AUTHORITY_ETCD_PASSWORD"
	// EnvPrefix is the key prefix every test namespace lives under (default
	// DefaultRoot); it must end in "/". Set it to a prefix the user may
	// read and write when the cluster's roles restrict key ranges.
	EnvPrefix = "AUTHORITY_ETCD_PREFIX"
)

// DefaultRoot is the key prefix of test namespaces when EnvPrefix is unset.
const DefaultRoot = "/etcdtest/"

// connectTimeout bounds the connection check of an external cluster.
var connectTimeout = 10 * time.Second

// ErrNeedsEmbedded reports an option an external cluster cannot honour.
var ErrNeedsEmbedded = errors.New("etcdtest: an external etcd cluster cannot offer this")

// ErrOutsideNamespace is returned, without sending anything, for a request of
// an external cluster's client that reaches outside Root (or compacts).
var ErrOutsideNamespace = errors.New("etcdtest: request outside the test namespace root")

// External reports whether EnvEndpoints names an external cluster to test
// against instead of an embedded server.
func External() bool { return strings.TrimSpace(os.Getenv(EnvEndpoints)) != "" }

// SkipIfExternal skips t, giving reason, when testing against an external
// cluster: for tests that need abilities only an embedded server offers.
func SkipIfExternal(t testing.TB, reason string) {
	t.Helper()
	if External() {
		t.Skipf("external etcd cluster: %s", reason)
	}
}

// Root returns the key prefix every Namespace lives under: EnvPrefix, or
// DefaultRoot.
func Root() string {
	if p := os.Getenv(EnvPrefix); p != "" {
		return p
	}
	return DefaultRoot
}

// external is the state of a Server on an external cluster: its settings,
// and what its clients granted and wrote, for Close.
type external struct {
	root               string
	tls                *tls.Config
	username, password string

	mu         sync.Mutex
	leases     map[clientv3.LeaseID]struct{}
	namespaces map[string]struct{}
	violations []string
}

// connectExternal returns a Server on the cluster the environment names,
// after checking that it answers and lets the user read Root.
func connectExternal() (*Server, error) {
	var eps []string
	for _, ep := range strings.Split(os.Getenv(EnvEndpoints), ",") {
		if ep = strings.TrimSpace(ep); ep != "" {
			eps = append(eps, ep)
		}
	}
	x := &external{
		root:     Root(),
		username: os.Getenv(EnvUser), password: os.Getenv(EnvPassword),
		leases: map[clientv3.LeaseID]struct{}{}, namespaces: map[string]struct{}{},
	}
	if !strings.HasSuffix(x.root, "/") || len(x.root) < 2 {
		return nil, fmt.Errorf("%s=%q must end in \"/\" and not be \"/\" alone", EnvPrefix, x.root)
	}
	if (x.username == "") != (x.password == "") {
		return nil, fmt.Errorf("set both %s and %s, or neither", EnvUser, EnvPassword)
	}
	info := transport.TLSInfo{TrustedCAFile: os.Getenv(EnvCACert), CertFile: os.Getenv(EnvCert), KeyFile: os.Getenv(EnvKey)}
	switch {
	case (info.CertFile == "") != (info.KeyFile == ""):
		return nil, fmt.Errorf("set both %s and %s, or neither", EnvCert, EnvKey)
	case info.TrustedCAFile != "" || info.CertFile != "":
		cfg, err := info.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("external etcd TLS: %w", err)
		}
		x.tls = cfg
	default:
		for _, ep := range eps {
			if strings.HasPrefix(ep, "https://") {
				x.tls = &tls.Config{MinVersion: tls.VersionTLS12} // system roots
				break
			}
		}
	}
	s := &Server{endpoint: eps[0], endpoints: eps, external: x}
	cfg := s.Config()
	cfg.DialTimeout = min(cfg.DialTimeout, connectTimeout)
	c, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("external etcd %v: %w", eps, err)
	}
	x.guard(c)
	defer func() { _ = c.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
	defer cancel()
	if _, err := c.Get(ctx, x.root, clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil {
		return nil, fmt.Errorf("external etcd %v: reading %q: %w", eps, x.root, err)
	}
	return s, nil
}

// Violations lists the requests an external cluster's clients refused with
// ErrOutsideNamespace (none for an embedded server).
func (s *Server) Violations() []string {
	if s.external == nil {
		return nil
	}
	s.external.mu.Lock()
	defer s.external.mu.Unlock()
	return append([]string(nil), s.external.violations...)
}

// guard makes c refuse requests outside the root and record its lease grants
// and the namespaces it writes to.
func (x *external) guard(c *clientv3.Client) {
	c.KV = guardKV{c.KV, x}
	c.Watcher = guardWatcher{c.Watcher, x}
	c.Lease = trackLease{c.Lease, x}
}

// close revokes the recorded leases and deletes the recorded namespaces.
func (x *external) close(cfg clientv3.Config) {
	x.mu.Lock()
	leases, namespaces := x.leases, x.namespaces
	x.leases, x.namespaces = map[clientv3.LeaseID]struct{}{}, map[string]struct{}{}
	x.mu.Unlock()
	if len(leases) == 0 && len(namespaces) == 0 {
		return
	}
	c, err := clientv3.New(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcdtest: cleaning up the external cluster: %v\n", err)
		return
	}
	defer func() { _ = c.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for id := range leases {
		_, _ = c.Revoke(ctx, id) // an expired lease is already gone
	}
	var ops []clientv3.Op
	flush := func() {
		if len(ops) == 0 {
			return
		}
		if _, err := c.Txn(ctx).Then(ops...).Commit(); err != nil {
			fmt.Fprintf(os.Stderr, "etcdtest: deleting test namespaces: %v\n", err)
		}
		ops = ops[:0]
	}
	for ns := range namespaces {
		ops = append(ops, clientv3.OpDelete(ns, clientv3.WithPrefix()))
		if len(ops) == 64 { // well within the default --max-txn-ops
			flush()
		}
	}
	flush()
}

// check refuses a request on [key, end) (end empty: key alone) outside the
// root, and records the namespace of a write.
func (x *external) check(what string, key, end []byte, write bool) error {
	root := x.root
	rootEnd := clientv3.GetPrefixRangeEnd(root)
	inside := strings.HasPrefix(string(key), root) &&
		(len(end) == 0 || string(end) != "\x00" && string(end) <= rootEnd)
	if !inside {
		msg := fmt.Sprintf("%s %q..%q", what, key, end)
		x.mu.Lock()
		x.violations = append(x.violations, msg)
		x.mu.Unlock()
		return fmt.Errorf("%w %q: %s", ErrOutsideNamespace, root, msg)
	}
	if write {
		if seg, _, ok := strings.Cut(string(key[len(root):]), "/"); ok && seg != "" {
			x.mu.Lock()
			x.namespaces[root+seg+"/"] = struct{}{}
			x.mu.Unlock()
		}
	}
	return nil
}

func (x *external) checkOp(op clientv3.Op) error {
	switch {
	case op.IsTxn():
		cmps, thenOps, elseOps := op.Txn()
		return x.checkTxn(cmps, append(thenOps, elseOps...))
	case op.IsPut():
		return x.check("put", op.KeyBytes(), nil, true)
	case op.IsDelete():
		return x.check("delete", op.KeyBytes(), op.RangeBytes(), true)
	default:
		return x.check("get", op.KeyBytes(), op.RangeBytes(), false)
	}
}

func (x *external) checkTxn(cmps []clientv3.Cmp, ops []clientv3.Op) error {
	for i := range cmps {
		pc := cmps[i].GetCompare()
		if err := x.check("compare", pc.Key, pc.RangeEnd, false); err != nil {
			return err
		}
	}
	for _, op := range ops {
		if err := x.checkOp(op); err != nil {
			return err
		}
	}
	return nil
}

// guardKV is a KV that refuses requests outside the root.
type guardKV struct {
	clientv3.KV
	x *external
}

func (k guardKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	if err := k.x.checkOp(clientv3.OpGet(key, opts...)); err != nil {
		return nil, err
	}
	return k.KV.Get(ctx, key, opts...)
}

func (k guardKV) Put(ctx context.Context, key, val string, opts ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	if err := k.x.checkOp(clientv3.OpPut(key, val, opts...)); err != nil {
		return nil, err
	}
	return k.KV.Put(ctx, key, val, opts...)
}

func (k guardKV) Delete(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.DeleteResponse, error) {
	if err := k.x.checkOp(clientv3.OpDelete(key, opts...)); err != nil {
		return nil, err
	}
	return k.KV.Delete(ctx, key, opts...)
}

// Compact is refused: it would compact every key of the cluster.
func (k guardKV) Compact(context.Context, int64, ...clientv3.CompactOption) (*clientv3.CompactResponse, error) {
	k.x.mu.Lock()
	k.x.violations = append(k.x.violations, "compact")
	k.x.mu.Unlock()
	return nil, fmt.Errorf("%w: compaction affects the whole cluster", ErrOutsideNamespace)
}

func (k guardKV) Do(ctx context.Context, op clientv3.Op) (clientv3.OpResponse, error) {
	if err := k.x.checkOp(op); err != nil {
		return clientv3.OpResponse{}, err
	}
	return k.KV.Do(ctx, op)
}

func (k guardKV) Txn(ctx context.Context) clientv3.Txn {
	return &guardTxn{txn: k.KV.Txn(ctx), x: k.x}
}

// guardTxn checks a Txn's compares and operations before Commit sends it.
type guardTxn struct {
	txn  clientv3.Txn
	x    *external
	cmps []clientv3.Cmp
	ops  []clientv3.Op
}

func (t *guardTxn) If(cs ...clientv3.Cmp) clientv3.Txn {
	t.cmps = append(t.cmps, cs...)
	t.txn = t.txn.If(cs...)
	return t
}

func (t *guardTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.ops = append(t.ops, ops...)
	t.txn = t.txn.Then(ops...)
	return t
}

func (t *guardTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.ops = append(t.ops, ops...)
	t.txn = t.txn.Else(ops...)
	return t
}

func (t *guardTxn) Commit() (*clientv3.TxnResponse, error) {
	if err := t.x.checkTxn(t.cmps, t.ops); err != nil {
		return nil, err
	}
	return t.txn.Commit()
}

// guardWatcher is a Watcher that refuses watches outside the root.
type guardWatcher struct {
	clientv3.Watcher
	x *external
}

func (w guardWatcher) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	op := clientv3.OpWatch(key, opts...)
	if err := w.x.check("watch", op.KeyBytes(), op.RangeBytes(), false); err != nil {
		ch := make(chan clientv3.WatchResponse, 1)
		ch <- clientv3.WatchResponse{Canceled: true, CancelReason: err.Error()}
		close(ch)
		return ch
	}
	return w.Watcher.Watch(ctx, key, opts...)
}

// trackLease records the leases granted, so Close can revoke them.
type trackLease struct {
	clientv3.Lease
	x *external
}

func (l trackLease) Grant(ctx context.Context, ttl int64) (*clientv3.LeaseGrantResponse, error) {
	resp, err := l.Lease.Grant(ctx, ttl)
	if err == nil {
		l.x.mu.Lock()
		l.x.leases[resp.ID] = struct{}{}
		l.x.mu.Unlock()
	}
	return resp, err
}

func (l trackLease) Revoke(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseRevokeResponse, error) {
	resp, err := l.Lease.Revoke(ctx, id)
	if err == nil {
		l.x.mu.Lock()
		delete(l.x.leases, id)
		l.x.mu.Unlock()
	}
	return resp, err
}
