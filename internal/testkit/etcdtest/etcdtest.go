// Package etcdtest starts an embedded etcd server (go.etcd.io/etcd/server/v3/embed)
// for tests and the CLI: on loopback, on ports the kernel picks, in a
// temporary directory, with quiet logging.
//
// A test package usually starts one server in TestMain (start-up takes about
// a second) with StartMain, and gives each test its own random namespace
// (Namespace).
//
// # External clusters
//
// When the environment variable AUTHORITY_ETCD_ENDPOINTS is set
// (comma-separated host:port or URLs), Start and StartMain connect to that
// cluster instead of starting a server (see EnvEndpoints and the other Env
// names for TLS, credentials and the key prefix). Close then leaves the
// cluster running. Clients of an external Server refuse (ErrOutsideNamespace)
// every request that reaches outside the namespace root (Root), so a test run
// never reads or writes a key of the cluster's other users; Close revokes the
// leases the run granted and deletes every namespace it wrote to. Tests that
// need what only an embedded server offers (custom server limits, compacting
// the whole keyspace, asserting that no other key exists) call
// SkipIfExternal.
package etcdtest

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/zlink-systems/authority/internal/embedded"
)

// readyTimeout bounds how long Start waits for the server to be ready.
const readyTimeout = 30 * time.Second

type options struct {
	fsync                  bool
	maxTxnOps              uint
	maxRequestBytes        uint
	autoCompactionMode     string
	autoCompactionRetained string
	dir                    string
	quotaBackendBytes      int64
	// serverSettings names the options an external cluster cannot honour.
	serverSettings []string
}

// Option configures Start.
type Option func(*options)

// WithFsync turns fsync on (true, for benchmarks and durability tests) or off
// (false, the default: UnsafeNoFsync for fast unit tests).
func WithFsync(on bool) Option { return func(o *options) { o.fsync = on } }

// WithMaxTxnOps sets the server's --max-txn-ops (default 128).
func WithMaxTxnOps(n uint) Option {
	return func(o *options) { o.maxTxnOps = n; o.serverSettings = append(o.serverSettings, "--max-txn-ops") }
}

// WithMaxRequestBytes sets the server's --max-request-bytes (default 1.5 MiB).
func WithMaxRequestBytes(n uint) Option {
	return func(o *options) {
		o.maxRequestBytes = n
		o.serverSettings = append(o.serverSettings, "--max-request-bytes")
	}
}

// WithAutoCompaction sets the auto-compaction mode ("periodic" or
// "revision") and retention (default "periodic", "1h").
func WithAutoCompaction(mode, retention string) Option {
	return func(o *options) {
		o.autoCompactionMode, o.autoCompactionRetained = mode, retention
		o.serverSettings = append(o.serverSettings, "--auto-compaction-*")
	}
}

// WithQuotaBackendBytes sets the server's --quota-backend-bytes (default
// etcd's 2 GiB).
func WithQuotaBackendBytes(n int64) Option {
	return func(o *options) {
		o.quotaBackendBytes = n
		o.serverSettings = append(o.serverSettings, "--quota-backend-bytes")
	}
}

// WithDir uses dir as the data directory instead of a new temporary one.
// The caller owns dir.
func WithDir(dir string) Option {
	return func(o *options) { o.dir = dir; o.serverSettings = append(o.serverSettings, "--data-dir") }
}

// Server is a running embedded etcd server, or a connection to the external
// cluster named by the environment (External).
type Server struct {
	etcd      *embed.Etcd // nil for an external cluster
	endpoint  string
	tempDir   string
	once      sync.Once
	external  *external // nil for an embedded server
	endpoints []string
}

// Start starts a server for t and registers its Close with t.Cleanup. The
// data directory is t.TempDir() unless WithDir says otherwise. When External,
// it connects to the external cluster instead, and skips t if an option asks
// for a server setting that cluster cannot be given.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	o := applyOptions(opts)
	if External() {
		if len(o.serverSettings) > 0 {
			t.Skipf("etcdtest: external etcd cluster: the test needs its own server settings (%s)",
				strings.Join(o.serverSettings, ", "))
		}
		s, err := connectExternal()
		if err != nil {
			t.Fatalf("etcdtest: %v", err)
		}
		t.Cleanup(s.Close)
		return s
	}
	if o.dir == "" {
		o.dir = t.TempDir()
	}
	s, err := start(o)
	if err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// StartMain starts a server outside any test (for TestMain or a CLI). Its data
// directory is a new temporary directory removed by Close. The caller must
// call Close. When External, it connects to the external cluster instead, and
// fails with ErrNeedsEmbedded if an option asks for a server setting.
func StartMain(opts ...Option) (*Server, error) {
	o := applyOptions(opts)
	if External() {
		if len(o.serverSettings) > 0 {
			return nil, fmt.Errorf("%w: %s", ErrNeedsEmbedded, strings.Join(o.serverSettings, ", "))
		}
		return connectExternal()
	}
	if o.dir == "" {
		dir, err := os.MkdirTemp("", "etcdtest-")
		if err != nil {
			return nil, err
		}
		o.dir = dir
		s, err := start(o)
		if err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
		s.tempDir = dir
		return s, nil
	}
	return start(o)
}

func applyOptions(opts []Option) options {
	o := options{
		maxTxnOps: embedded.DefaultMaxTxnOps, maxRequestBytes: embedded.DefaultMaxRequestBytes,
		autoCompactionMode: embedded.DefaultAutoCompactionMode, autoCompactionRetained: embedded.DefaultAutoCompactionRetention,
	}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

func start(o options) (*Server, error) { return launch(embedConfig(o, "http")) }

// launch starts an embedded member from cfg and waits until it serves.
func launch(cfg *embed.Config) (*Server, error) {
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("start embedded etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(readyTimeout):
		e.Server.Stop()
		e.Close()
		return nil, errors.New("embedded etcd was not ready in time")
	}
	if len(e.Clients) == 0 {
		e.Close()
		return nil, errors.New("embedded etcd has no client listener")
	}
	ep := e.Clients[0].Addr().String()
	return &Server{etcd: e, endpoint: ep, endpoints: []string{ep}}, nil
}

// Endpoint returns the client address (host:port); for an external cluster,
// its first endpoint.
func (s *Server) Endpoint() string { return s.endpoint }

// Endpoints returns every client endpoint.
func (s *Server) Endpoints() []string {
	if len(s.endpoints) == 0 {
		return []string{s.endpoint}
	}
	return append([]string(nil), s.endpoints...)
}

// Config returns a client configuration for the server with room for
// requests up to the server's request limit; for an external cluster, with
// the TLS and credentials of the environment.
func (s *Server) Config() clientv3.Config {
	cfg := clientv3.Config{
		Endpoints:          s.Endpoints(),
		DialTimeout:        5 * time.Second,
		MaxCallSendMsgSize: 4 * 1024 * 1024,
		MaxCallRecvMsgSize: 16 * 1024 * 1024,
		Logger:             zap.NewNop(),
	}
	if s.external != nil {
		cfg.TLS = s.external.tls
		cfg.Username, cfg.Password = s.external.username, s.external.password
	}
	return cfg
}

// NewClient returns a new client of the server; the caller closes it. A
// client of an external cluster refuses requests outside Root and records
// its lease grants for Close.
func (s *Server) NewClient() (*clientv3.Client, error) { return s.newClient(s.Config()) }

func (s *Server) newClient(cfg clientv3.Config) (*clientv3.Client, error) {
	c, err := clientv3.New(cfg)
	if err != nil {
		return nil, err
	}
	if s.external != nil {
		s.external.guard(c)
	}
	return c, nil
}

// Client returns a new client of the server, closed at t's cleanup.
func (s *Server) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	c, err := s.NewClient()
	if err != nil {
		t.Fatalf("etcdtest: client: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// ClientWith returns a new client of the server whose configuration edit
// changed (for example its message size limits), closed at t's cleanup.
func (s *Server) ClientWith(t testing.TB, edit func(*clientv3.Config)) *clientv3.Client {
	t.Helper()
	cfg := s.Config()
	edit(&cfg)
	c, err := s.newClient(cfg)
	if err != nil {
		t.Fatalf("etcdtest: client: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Close stops the server and waits for it; it is safe to call more than once.
// An external cluster keeps running: Close revokes the leases this Server's
// clients granted and deletes the namespaces they wrote to.
func (s *Server) Close() {
	s.once.Do(func() {
		if s.external != nil {
			s.external.close(s.Config())
			return
		}
		s.etcd.Close()
		<-s.etcd.Server.StopNotify()
		if s.tempDir != "" {
			_ = os.RemoveAll(s.tempDir)
		}
	})
}

// Namespace returns a fresh random namespace Root()+"<hex>/" (by default
// "/etcdtest/<hex>/") so tests sharing a server never see each other's keys.
func Namespace() string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return Root() + hex.EncodeToString(b[:]) + "/"
}

// embedConfig is the embedded member's configuration: loopback port 0 for
// peers and clients (clientScheme "http" or "https"), quiet logging, and the
// options' fsync, limits and auto-compaction.
func embedConfig(o options, clientScheme string) *embed.Config {
	return embedded.Member{
		Name: "etcdtest", Dir: o.dir,
		PeerURL:   url.URL{Scheme: "http", Host: "127.0.0.1:0"},
		ClientURL: url.URL{Scheme: clientScheme, Host: "127.0.0.1:0"},
		Fsync:     o.fsync, MaxTxnOps: o.maxTxnOps, MaxRequestBytes: o.maxRequestBytes,
		AutoCompactionMode: o.autoCompactionMode, AutoCompactionRetention: o.autoCompactionRetained,
		QuotaBackendBytes: o.quotaBackendBytes,
	}.Config()
}
