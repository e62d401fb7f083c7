// Package embedded runs a single-member etcd server in-process
// (go.etcd.io/etcd/server/v3/embed) for authorityctl's demo: on loopback, in a
// data directory of the caller's choice or a temporary one, with quiet
// logging and the server limits the authority store's etcd provider needs.
// Its Member is the one builder of embedded etcd configurations in this
// module, also used by internal/testkit/etcdtest and internal/testkit/etcdcluster.
package embedded

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"sync"

	"go.etcd.io/etcd/server/v3/embed"
)

// Defaults of Config.
const (
	// DefaultClientAddr lets the kernel pick a loopback port.
	DefaultClientAddr = "127.0.0.1:0"
	// DefaultMaxTxnOps is etcd's default --max-txn-ops.
	DefaultMaxTxnOps = 128
	// DefaultMaxRequestBytes is etcd's default --max-request-bytes (1.5 MiB).
	DefaultMaxRequestBytes = 1536 * 1024
	// DefaultAutoCompactionMode and DefaultAutoCompactionRetention turn
	// periodic auto-compaction on (embedded etcd has it off by default).
	DefaultAutoCompactionMode      = "periodic"
	DefaultAutoCompactionRetention = "1h"
)

// Config configures Start. The zero value is a usable configuration.
type Config struct {
	// Dir is the data directory. Empty: a new temporary directory that Close
	// removes. A given Dir is kept.
	Dir string
	// ClientAddr is the client listen address (host:port; default
	// DefaultClientAddr).
	ClientAddr string
	// Fsync turns fsync on. Off (UnsafeNoFsync) is faster and loses recent
	// writes on a machine crash.
	Fsync bool
	// MaxTxnOps is the server's --max-txn-ops (default DefaultMaxTxnOps).
	MaxTxnOps uint
	// MaxRequestBytes is the server's --max-request-bytes (default
	// DefaultMaxRequestBytes).
	MaxRequestBytes uint
	// AutoCompactionMode ("periodic" or "revision") and
	// AutoCompactionRetention (default DefaultAutoCompactionMode,
	// DefaultAutoCompactionRetention). Retention "0" turns it off.
	AutoCompactionMode      string
	AutoCompactionRetention string
	// LogOutput receives the server's error log (default os.Stderr).
	LogOutput io.Writer
	// QuotaBackendBytes is the server's --quota-backend-bytes (0: etcd's
	// default, 2 GiB).
	QuotaBackendBytes int64
}

// Server is a running embedded etcd server.
type Server struct {
	etcd     *embed.Etcd
	endpoint string
	tempDir  string
	once     sync.Once
}

// Start starts a server and waits until it serves clients or ctx ends.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.ClientAddr == "" {
		cfg.ClientAddr = DefaultClientAddr
	}
	clientURL, err := url.Parse("http://" + cfg.ClientAddr)
	if err != nil || clientURL.Host != cfg.ClientAddr {
		return nil, fmt.Errorf("embedded etcd: client address %q is not host:port", cfg.ClientAddr)
	}
	s := &Server{}
	dir := cfg.Dir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "authorityctl-etcd-"); err != nil {
			return nil, fmt.Errorf("embedded etcd: %w", err)
		}
		s.tempDir = dir
	}
	ec := Member{
		Name: "authorityctl", Dir: dir, PeerURL: url.URL{Scheme: "http", Host: "127.0.0.1:0"}, ClientURL: *clientURL,
		Fsync: cfg.Fsync, MaxTxnOps: cfg.MaxTxnOps, MaxRequestBytes: cfg.MaxRequestBytes,
		AutoCompactionMode: cfg.AutoCompactionMode, AutoCompactionRetention: cfg.AutoCompactionRetention,
		QuotaBackendBytes: cfg.QuotaBackendBytes, LogOutput: cfg.LogOutput,
	}.Config()
	e, err := embed.StartEtcd(ec)
	if err != nil {
		s.removeTemp()
		return nil, fmt.Errorf("embedded etcd: start: %w", err)
	}
	s.etcd = e
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		s.Close()
		return nil, fmt.Errorf("embedded etcd: %w", err)
	case <-ctx.Done():
		s.Close()
		return nil, fmt.Errorf("embedded etcd: not ready: %w", ctx.Err())
	}
	if len(e.Clients) == 0 {
		s.Close()
		return nil, errors.New("embedded etcd: no client listener")
	}
	s.endpoint = e.Clients[0].Addr().String()
	return s, nil
}

// Endpoint returns the client address (host:port) the server listens on.
func (s *Server) Endpoint() string { return s.endpoint }

// Close stops the server, waits for it, and removes its temporary data
// directory, if it made one. It is safe to call more than once.
func (s *Server) Close() {
	s.once.Do(func() {
		if s.etcd != nil {
			s.etcd.Close()
			<-s.etcd.Server.StopNotify()
		}
		s.removeTemp()
	})
}

func (s *Server) removeTemp() {
	if s.tempDir != "" {
		_ = os.RemoveAll(s.tempDir)
	}
}
