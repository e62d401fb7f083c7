package embedded

import (
	"io"
	"net/url"
	"os"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Member describes one embedded etcd member. Its Config method is the one
// builder of embedded etcd configurations in this module: Start, the test
// servers of internal/testkit/etcdtest and the member processes of
// internal/testkit/etcdcluster all use it, so they share the defaults below and the
// quiet logger. A zero field takes its default.
type Member struct {
	// Name is the member's name (required).
	Name string
	// Dir is the data directory (required).
	Dir string
	// PeerURL and ClientURL are the member's listen (and advertised) URLs.
	PeerURL, ClientURL url.URL
	// InitialCluster is the --initial-cluster value (default: a cluster of
	// this member alone).
	InitialCluster string
	// ClusterState ("new" or "existing") and ClusterToken are
	// --initial-cluster-state and --initial-cluster-token (default etcd's).
	ClusterState, ClusterToken string
	// TickMs and ElectionMs are --heartbeat-interval and --election-timeout
	// (default etcd's).
	TickMs, ElectionMs uint
	// SnapshotCount is --snapshot-count (default etcd's).
	SnapshotCount uint64
	// Fsync turns fsync on. Off (UnsafeNoFsync) is faster and loses recent
	// writes on a machine crash.
	Fsync bool
	// MaxTxnOps is --max-txn-ops (default DefaultMaxTxnOps).
	MaxTxnOps uint
	// MaxRequestBytes is --max-request-bytes (default DefaultMaxRequestBytes).
	MaxRequestBytes uint
	// AutoCompactionMode and AutoCompactionRetention (default
	// DefaultAutoCompactionMode, DefaultAutoCompactionRetention); retention
	// "0" turns auto-compaction off.
	AutoCompactionMode, AutoCompactionRetention string
	// QuotaBackendBytes is --quota-backend-bytes (0: etcd's default, 2 GiB).
	QuotaBackendBytes int64
	// LogOutput receives the server's error log (default os.Stderr).
	LogOutput io.Writer
}

// Config returns the embed.Config of m: its URLs and cluster, the limits,
// auto-compaction and fsync setting, no gRPC gateway, and error-level
// logging to m.LogOutput through QuietLogger.
func (m Member) Config() *embed.Config {
	cfg := embed.NewConfig()
	cfg.Name = m.Name
	cfg.Dir = m.Dir
	cfg.ListenPeerUrls = []url.URL{m.PeerURL}
	cfg.AdvertisePeerUrls = []url.URL{m.PeerURL}
	cfg.ListenClientUrls = []url.URL{m.ClientURL}
	cfg.AdvertiseClientUrls = []url.URL{m.ClientURL}
	cfg.InitialCluster = m.InitialCluster
	if cfg.InitialCluster == "" {
		cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	}
	if m.ClusterState != "" {
		cfg.ClusterState = m.ClusterState
	}
	if m.ClusterToken != "" {
		cfg.InitialClusterToken = m.ClusterToken
	}
	if m.TickMs > 0 {
		cfg.TickMs = m.TickMs
	}
	if m.ElectionMs > 0 {
		cfg.ElectionMs = m.ElectionMs
	}
	if m.SnapshotCount > 0 {
		cfg.SnapshotCount = m.SnapshotCount
	}
	cfg.UnsafeNoFsync = !m.Fsync
	cfg.MaxTxnOps = orDefault(m.MaxTxnOps, DefaultMaxTxnOps)
	cfg.MaxRequestBytes = orDefault(m.MaxRequestBytes, DefaultMaxRequestBytes)
	cfg.AutoCompactionMode = orDefault(m.AutoCompactionMode, DefaultAutoCompactionMode)
	cfg.AutoCompactionRetention = orDefault(m.AutoCompactionRetention, DefaultAutoCompactionRetention)
	cfg.QuotaBackendBytes = m.QuotaBackendBytes
	cfg.EnableGRPCGateway = false
	out := m.LogOutput
	if out == nil {
		out = os.Stderr
	}
	cfg.Logger = "zap"
	cfg.LogLevel = "error"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(QuietLogger(out))
	return cfg
}

func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// QuietLogger logs errors to w, except the listener errors every shutdown
// produces.
func QuietLogger(w io.Writer) *zap.Logger {
	enc := zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig())
	return zap.New(quietCore{zapcore.NewCore(enc, zapcore.Lock(zapcore.AddSync(w)), zapcore.ErrorLevel)})
}

type quietCore struct{ zapcore.Core }

func (c quietCore) With(fields []zapcore.Field) zapcore.Core { return quietCore{c.Core.With(fields)} }

func (c quietCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if e.Message == "setting up serving from embedded etcd failed." {
		return ce
	}
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}
