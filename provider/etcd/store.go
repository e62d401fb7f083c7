package etcd

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/internal/observe"
	"github.com/zlink-systems/authority/provider/etcd/internal/revguard"
	"github.com/zlink-systems/authority/provider/etcd/internal/txnkit"
	"github.com/zlink-systems/authority/provider/etcd/preflight"
	"github.com/zlink-systems/authority/provider/etcd/schema"
)

// Default limits, matching etcd's server defaults.
const (
	// DefaultMaxTxnOps is etcd's default --max-txn-ops.
	DefaultMaxTxnOps = preflight.DefaultMaxTxnOps
	// DefaultMaxRequestBytes is etcd's default --max-request-bytes (1.5 MiB).
	DefaultMaxRequestBytes = 1536 * 1024
	// DefaultReservationRetention is how long a reservation terminal or a
	// finished aggregate record is kept.
	DefaultReservationRetention = 24 * time.Hour
)

// DefaultNamespace is the namespace of a Config that names none.
const DefaultNamespace = "/zlink/authority/v1/"

// Config configures New. Either Client or Endpoints must be set.
type Config struct {
	// Client is an existing client; the store does not close it. When nil,
	// New dials Endpoints with the TLS, credential and timeout settings below.
	Client *clientv3.Client

	// Endpoints of the etcd cluster (when Client is nil).
	Endpoints []string
	// CAFile, CertFile and KeyFile turn TLS on (CAFile alone: server
	// verification only).
	CAFile, CertFile, KeyFile string
	// Username and Password authenticate to etcd.
	Username, Password string
	// DialTimeout bounds connecting (default 5 s).
	DialTimeout time.Duration

	// RequestTimeout bounds each etcd request (0: only the caller's context).
	RequestTimeout time.Duration

	// Namespace prefixes every key; it must end in "/" (default
	// DefaultNamespace).
	Namespace string
	// Clock is the store's clock (default the wall clock). The store reads
	// it through an authority.MonotonicClock: when it steps back, expiry
	// does not (docs/deviations.md C18).
	Clock authority.Clock
	// CapacityPolicy is the placement capacity policy (nil: every placement
	// fits). SetCapacityPolicy replaces it.
	CapacityPolicy authority.CapacityPolicy
	// IdentityClaims reports keys claimed elsewhere (nil: none).
	IdentityClaims authority.IdentityClaims
	// CapacityEscrow turns escrow mode on (nil, the default: off): the
	// namespace is one shard of several (package provider/sharded), each
	// reservation and aggregate prepare must also fit this shard's budget
	// slice of its node lifecycle, and a short slice asks CapacityEscrow to
	// grow it (escrow.go). Only a store in escrow mode writes budget keys.
	CapacityEscrow CapacityEscrow

	// MaxTxnOps is the server's --max-txn-ops (default 128); larger Txns are
	// refused before sending.
	MaxTxnOps int
	// MaxRequestBytes is the server's --max-request-bytes (default 1.5 MiB);
	// larger requests are refused before sending.
	MaxRequestBytes int
	// ReservationRetention is how long reservation terminals and committed
	// or aborted aggregate records are kept (default
	// DefaultReservationRetention): the window in which a retried commit or
	// abort is answered already*.
	ReservationRetention time.Duration

	// MaxConcurrentTxns is how many batchable write Txns the store keeps in
	// flight at once (default DefaultMaxConcurrentTxns; negative: no limit
	// and no batching). Writes that find them all busy are sent together as
	// one Txn when the next one ends, each keeping its own outcome
	// (internal/txnkit/batch.go). Writes that cannot be batched (a reservation under a
	// capacity policy, which is group-committed per node) do not wait.
	MaxConcurrentTxns int

	// SkipVersionCheck skips the checks New makes of the server: its
	// version (ServerWarning), and that the client's etcd user may read and
	// write the namespace (else New fails with ErrAccessDenied naming the
	// user, the permission and the prefix). Not the store version check:
	// see storeversion.
	SkipVersionCheck bool

	// ReadOnly opens the store for reading only, for tools that inspect a
	// namespace (authorityctl's read-only commands): New writes nothing
	// (no announcement and its lease, no store-version bootstrap of an empty
	// namespace; the access check asks for read permission only), the store
	// works at the namespace's active version as it reads it (absent:
	// storeversion.Base) and follows it, and every write (a row, a record, a
	// lease grant, Finalize without dry run) is refused before it is sent,
	// with an error wrapping ErrReadOnly and authority.ErrAccessDenied. A
	// read-only store is invisible to `upgrade status` and to Finalize.
	ReadOnly bool

	// ShardMember says the store serves one shard of a store over several
	// clusters (provider/sharded sets it), or is a tool writing one shard
	// directly on purpose (authorityctl). Without it, New of a writing store
	// refuses a namespace whose shard map lists several shards
	// (ErrShardedNamespace), writing nothing.
	ShardMember bool

	// Role is what the process announces itself as under the namespace
	// (default "store"; authorityctl announces "authorityctl").
	Role string
	// Build names the running build in the announcement (default: the
	// binary's module version or VCS revision).
	Build string

	// Registerer receives the store's Prometheus metrics (nil: none; two
	// stores on one Registerer share them).
	Registerer prometheus.Registerer
	// TracerProvider makes a span of every operation, a child span of each
	// etcd round trip, and names the compare a refused write failed (nil:
	// none).
	TracerProvider trace.TracerProvider
	// Logger receives the store's events: owner leases lost, keep-alives
	// failing, usage watch restarts, compaction seen, cluster regression,
	// prune and rebind results (nil: none).
	Logger *slog.Logger

	// ShardMapFence fences the store on its namespace's shard map, for a
	// store over several clusters (provider/sharded): every write Txn and
	// every read of rows made on a context carrying a map revision
	// (WithShardMapRevision) holds only while the shard-map key is at it,
	// else fails with ErrShardMapChanged, writing nothing (shardfence.go).
	// Off for a store of one cluster.
	ShardMapFence bool
}

// Store is the etcd authority store. It implements authority.Store and
// authority.ChangeWaiter (their methods, observed, come from the embedded
// contract: operations.go). It is safe for concurrent use.
type Store struct {
	client     *clientv3.Client
	ownsClient bool
	kv         clientv3.KV
	keys       schema.Layout
	clock      authority.Clock
	claims     authority.IdentityClaims
	policy     atomic.Pointer[policyBox]
	escrow     CapacityEscrow // escrow mode (nil: off)
	maxOps     int
	maxBytes   int
	// wire is the configured Txn limits, which maxBytes keeps room under
	// for the map fence (keepFenceRoom).
	wire      txnkit.Limits
	retention time.Duration
	timeout   time.Duration
	// dialTimeout bounds the server check of New when ctx has no deadline.
	dialTimeout time.Duration
	// tlsConfig is the TLS New dialed with (nil: plain text or a caller's client).
	tlsConfig *tls.Config
	cache     *rowCache
	aggs      *txnkit.BoundedCache[string, knownAggregate] // by record key
	leases    *leaseBuckets
	batch     *txnkit.Batcher
	usage     *usageWatches
	groups    reserveGroups // group commit of reservations, per node lifecycle
	// noStream is set once the server answered that it has no RangeStream
	// (paging.go).
	noStream atomic.Bool
	// guard refuses every request once the cluster went back in time
	// (internal/revguard).
	guard *revguard.Guard
	// obs records operations, Txns, owner leases and usage watches (nil:
	// nothing is recorded).
	obs *observe.Observer
	// contract is the contract's methods, observed (operations.go).
	contract

	mu     sync.Mutex
	marks  map[string]clientv3.LeaseID // liveness key → lease of MarkLive
	held   heldLeases                  // owner leases Close revokes
	closed atomic.Bool
	// life ends when the store is closed: waits that outlive one request
	// (WaitForChange, owner lease keep-alives) end with it.
	life    context.Context
	endLife context.CancelFunc
	// serverWarning is preflight.ServerVersionWarning of the server New checked.
	serverWarning string
	// version is the namespace's store version and this process's
	// announcement (announce.go).
	version versionGate
	// readOnly refuses every write (Config.ReadOnly, readonly.go).
	readOnly bool
	// shardFence fences writes and row reads on the shard map
	// (Config.ShardMapFence, shardfence.go).
	shardFence bool
	// standing is a single-cluster writing store's map fence, set by New
	// (shardfence.go).
	standing standingFence
}

type policyBox struct{ p authority.CapacityPolicy }

var (
	_ authority.Store        = (*Store)(nil)
	_ authority.ChangeWaiter = (*Store)(nil)
)

// New returns a store on the configured cluster.
func New(ctx context.Context, cfg Config) (*Store, error) {
	if cfg.Namespace == "" {
		cfg.Namespace = DefaultNamespace
	}
	if err := schema.ValidateNamespace(cfg.Namespace); err != nil {
		return nil, err
	}
	if cfg.MaxTxnOps == 0 {
		cfg.MaxTxnOps = DefaultMaxTxnOps
	}
	if cfg.MaxRequestBytes == 0 {
		cfg.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if cfg.MaxTxnOps < 8 || cfg.MaxRequestBytes < 64*1024 {
		return nil, authority.Invalid("etcd limits must allow 8 operations and 64 KiB per request.")
	}
	if cfg.ReservationRetention <= 0 {
		cfg.ReservationRetention = DefaultReservationRetention
	}
	if cfg.ReservationRetention > authority.MaxRetention {
		// its records live on leases, which would end before it
		return nil, authority.Invalid("etcd reservation retention must not exceed 365 days.")
	}
	s := &Store{
		client: cfg.Client, keys: schema.NewLayout(cfg.Namespace), clock: authority.NewMonotonicClock(cfg.Clock), claims: cfg.IdentityClaims, escrow: cfg.CapacityEscrow,
		maxOps: cfg.MaxTxnOps, maxBytes: cfg.MaxRequestBytes, retention: cfg.ReservationRetention,
		obs:     observe.New(observe.Config{Registerer: cfg.Registerer, TracerProvider: cfg.TracerProvider, Logger: cfg.Logger}),
		timeout: cfg.RequestTimeout, cache: newRowCache(4096), aggs: txnkit.NewBoundedCache[string, knownAggregate](1024), marks: map[string]clientv3.LeaseID{}, groups: reserveGroups{m: map[string]*nodeQueue{}},
		dialTimeout: cfg.DialTimeout, shardFence: cfg.ShardMapFence,
	}
	s.keepFenceRoom(cfg)
	s.contract = observe.NewContract(s.obs, s.work())
	s.life, s.endLife = context.WithCancel(context.Background())
	if s.dialTimeout <= 0 {
		s.dialTimeout = 5 * time.Second
	}
	s.policy.Store(&policyBox{cfg.CapacityPolicy})
	if s.client == nil {
		c, tlsConfig, err := dial(cfg)
		if err != nil {
			return nil, err
		}
		s.client, s.ownsClient, s.tlsConfig = c, true, tlsConfig
	}
	s.guard = revguard.New(s.keys.Namespace(), func(err error) error { return mapError(err, false) })
	s.kv = s.guard.KV(s.client.KV)
	if cfg.ReadOnly {
		s.readOnly, s.kv = true, readOnlyKV{KV: s.kv, refused: s.readOnlyError()}
	}
	s.guard.Watch(s.client.ActiveConnection())
	s.guard.Follow(s.client.Endpoints)
	s.leases = newLeaseBuckets(s)
	s.usage = newUsageWatches(s)
	switch {
	case cfg.MaxConcurrentTxns == 0:
		s.batch = s.newBatcher(DefaultMaxConcurrentTxns)
	case cfg.MaxConcurrentTxns < 0:
		s.batch = s.newBatcher(0)
	default:
		s.batch = s.newBatcher(cfg.MaxConcurrentTxns)
	}
	if !cfg.SkipVersionCheck {
		if err := s.checkServer(ctx); err != nil {
			_ = s.Close()
			return nil, err
		}
		if err := s.checkAccess(ctx); err != nil {
			_ = s.Close()
			return nil, err
		}
	}
	if err := s.startVersion(ctx, cfg); err != nil {
		_ = s.Close()
		return nil, err
	}
	return s, nil
}

func dial(cfg Config) (*clientv3.Client, *tls.Config, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, nil, authority.Invalid("etcd store needs a client or endpoints.")
	}
	cc := clientv3.Config{
		Endpoints: cfg.Endpoints, Username: cfg.Username, Password: cfg.Password,
		DialTimeout: cfg.DialTimeout, Logger: zap.NewNop(),
		MaxCallSendMsgSize: max(2*1024*1024, cfg.MaxRequestBytes+256*1024),
		MaxCallRecvMsgSize: 64 * 1024 * 1024,
		// Keep-alives drop a connection to a partitioned member instead of
		// letting every request routed to it hang until its deadline.
		DialKeepAliveTime: 10 * time.Second, DialKeepAliveTimeout: 3 * time.Second,
	}
	if cc.DialTimeout == 0 {
		cc.DialTimeout = 5 * time.Second
	}
	t, err := preflight.ClientTLS(cfg.CAFile, cfg.CertFile, cfg.KeyFile)
	if err != nil {
		return nil, nil, authority.Wrap(authority.ErrInvalidArgument, "etcd client TLS", err)
	}
	cc.TLS = t
	c, err := clientv3.New(cc)
	if err != nil {
		return nil, nil, mapError(err, false)
	}
	return c, cc.TLS, nil
}

// checkServer refuses servers older than preflight.MinServerVersion. It asks the
// first endpoint: the members of a cluster run one version outside upgrades.
func (s *Store) checkServer(ctx context.Context) error {
	eps := s.client.Endpoints()
	if len(eps) == 0 {
		return nil
	}
	ctx, cancel := s.requestContext(ctx)
	defer cancel()
	if _, has := ctx.Deadline(); !has {
		var cancelDial context.CancelFunc
		ctx, cancelDial = context.WithTimeout(ctx, s.dialTimeout)
		defer cancelDial()
	}
	st, err := s.client.Status(ctx, eps[0])
	if err != nil {
		// The client only reports an unreachable or TLS-refusing endpoint
		// as a deadline; probe it to say what is wrong.
		if !s.ownsClient {
			return mapError(err, false) // a caller's client: its TLS settings are not known here
		}
		return connectFailure(ctx, eps[0], s.tlsConfig, err)
	}
	s.serverWarning = preflight.ServerVersionWarning(st.Version)
	return checkServerVersion(eps[0], st.Version)
}

// ServerWarning returns preflight.ServerVersionWarning of the server New checked (""
// when its version has no known bug, or with SkipVersionCheck). New accepts
// such a server: log the warning, or refuse it yourself.
func (s *Store) ServerWarning() string { return s.serverWarning }

// checkServerVersion refuses the version reported by the server at endpoint
// if it is older than preflight.MinServerVersion (or missing).
func checkServerVersion(endpoint, version string) error {
	if version == "" || !preflight.ServerVersionAtLeast(version, preflight.MinServerVersion) {
		if version == "" {
			version = "of unknown version"
		}
		return authority.Wrap(authority.ErrUnsupportedServer, fmt.Sprintf(
			"etcd server %s at %s is older than the minimum supported version %s; upgrade it (or set Config.SkipVersionCheck at your own risk)",
			version, endpoint, preflight.MinServerVersion), nil)
	}
	return nil
}

// closeRevokeTimeout bounds the revokes Close sends (owner leases, the
// announcement, the expiry leases of records).
var closeRevokeTimeout = 5 * time.Second

// Close releases the store's leases for MarkLive, stops and revokes every
// owner lease it still holds (each one's Done closes before its revoke) and
// closes the client when the store dialled it. Rows and records stay.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	if s.endLife != nil {
		s.endLife()
	}
	s.batch.Close()
	s.usage.close()
	s.guard.Close()
	s.mu.Lock()
	marks := s.marks
	s.marks = map[string]clientv3.LeaseID{}
	s.mu.Unlock()
	// a caller's client closed before the store ends the revokes at once:
	// nothing can be sent on it (the leases expire by their TTL)
	ctx, cancel := context.WithTimeout(s.client.Ctx(), closeRevokeTimeout)
	defer cancel()
	s.held.close(ctx, s.client) // before the client closes: OwnerLease.Close promises a revoke
	s.obs.Metrics().Close()     // its leases no longer count in the shared gauges
	s.closeVersion(ctx)
	for _, id := range marks {
		_, _ = s.client.Revoke(ctx, id)
	}
	if s.ownsClient {
		return s.client.Close()
	}
	return nil
}

// Namespace returns the store's namespace.
func (s *Store) Namespace() string { return s.keys.Namespace() }

// SetCapacityPolicy replaces the placement capacity policy (nil: every
// placement fits).
func (s *Store) SetCapacityPolicy(p authority.CapacityPolicy) { s.policy.Store(&policyBox{p}) }

func (s *Store) capacityPolicy() authority.CapacityPolicy { return s.policy.Load().p }

// RecordRetention is how long the store keeps reservation terminals and
// committed or aborted aggregate records (Config.ReservationRetention).
func (s *Store) RecordRetention() time.Duration { return s.retention }

func (s *Store) requestContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if s.timeout > 0 {
		return context.WithTimeout(ctx, s.timeout)
	}
	return context.WithCancel(ctx)
}

// detachedContext is requestContext for work that must finish even when the
// caller's ctx ends (a Grant shared by several callers, revoking a lease the
// caller no longer needs): it keeps ctx's values, not its cancellation, and
// is bounded by the request timeout or, when there is none, the dial
// timeout, so a partition cannot hang it.
func (s *Store) detachedContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if s.timeout > 0 {
		return context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
	}
	return context.WithTimeout(context.WithoutCancel(ctx), s.dialTimeout)
}

// revokeDetached revokes a lease the failed request granted, on a
// detachedContext; a revoke that fails leaves the lease to expire.
func (s *Store) revokeDetached(ctx context.Context, id clientv3.LeaseID) {
	rctx, cancel := s.detachedContext(ctx)
	defer cancel()
	_, _ = s.client.Revoke(rctx, id)
}

func (s *Store) begin(ctx context.Context) error {
	if s.closed.Load() {
		return authority.ErrClosed
	}
	if err := s.versionSkew(); err != nil {
		return err
	}
	return ctx.Err()
}

var errContention = errors.New("too much contention")
