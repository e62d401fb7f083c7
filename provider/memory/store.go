package memory

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/tidwall/btree"
	"go.opentelemetry.io/otel/trace"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/internal/observe"
)

// Default settings of Config.
const (
	// DefaultReservationRetention is how long swept records (reservation terminals,
	// committed or aborted aggregates) are kept when Config.ReservationRetention is 0.
	DefaultReservationRetention = 10 * time.Minute
	// DefaultScanRetention is how long a listing stays continuable when
	// Config.ScanRetention is 0.
	DefaultScanRetention = 5 * time.Minute
	// DefaultMaxPinnedScans is how many listing revisions stay pinned when
	// Config.MaxPinnedScans is 0.
	DefaultMaxPinnedScans = 64
)

// Config configures a Store.
type Config struct {
	// Liveness says whether an owner lease is live on a node. Required.
	Liveness authority.LivenessOracle
	// CapacityPolicy decides whether a placement fits its node; nil means
	// every placement fits. SetCapacityPolicy replaces it later.
	CapacityPolicy authority.CapacityPolicy
	// IdentityClaims says which keys are claimed elsewhere; nil means no key is
	// claimed. SetIdentityClaims replaces it later.
	IdentityClaims authority.IdentityClaims
	// Clock is the store's clock; nil means authority.SystemClock. The store
	// reads it through an authority.MonotonicClock: when it steps back,
	// expiry does not (docs/deviations.md C18).
	Clock authority.Clock
	// ReservationRetention is how long a reservation terminal (the record that makes a
	// re-commit report alreadyCommitted and a re-abort alreadyAborted) and a
	// committed or aborted aggregate record are kept; 0 means
	// DefaultReservationRetention. Creation terminals are kept until their ExpiresAt.
	ReservationRetention time.Duration
	// ScanRetention is how long a listing can be continued after its first
	// page; 0 means DefaultScanRetention.
	ScanRetention time.Duration
	// MaxPinnedScans bounds how many listing revisions are pinned at once;
	// starting a listing beyond it drops the oldest. 0 means
	// DefaultMaxPinnedScans.
	MaxPinnedScans int
	// FeedRetention is how many row changes the row feed keeps, from the
	// first WatchRows on, for feeds that are behind or resume; 0 means
	// DefaultFeedRetention. A feed that needs an older change gets
	// authority.ErrFeedCompacted.
	FeedRetention int

	// Registerer receives the store's Prometheus metrics (nil: none; two
	// stores on one Registerer share them).
	Registerer prometheus.Registerer
	// TracerProvider makes a span of every operation (nil: none).
	TracerProvider trace.TracerProvider
	// Logger receives the store's events (nil: none).
	Logger *slog.Logger
}

// Store is the in-memory authority store. It implements authority.Store and
// authority.ChangeWaiter (their methods, observed, come from the embedded
// contract: operations.go). The zero value is not usable; call New.
type Store struct {
	liveness      authority.LivenessOracle
	clock         authority.Clock
	retention     time.Duration
	scanRetention time.Duration
	maxPins       int
	// scope binds this store's scan cursors to it.
	scope string

	mu     sync.Mutex
	policy authority.CapacityPolicy
	claims authority.IdentityClaims

	// index holds the rows in key order; probe and hint make lookups
	// allocation-free.
	index *btree.BTreeG[*row]
	probe row
	hint  btree.PathHint
	// revision counts row writes; a listing pins the index at a revision.
	revision int64
	pins     []pin
	// copying counts the listings copying rows outside the lock.
	copying int
	// cellCache resolves the capacity cells of reservations.
	cellCache cellCache

	storeVersion     int64
	objectGeneration int64
	ownerGeneration  int64

	// reservations holds the open reservations and their terminals.
	reservations       reservationTable
	operationTerminals map[string]*authority.TerminalRecord
	aggregates         map[authority.Fence]*aggregateRecord
	counters           map[authority.CapacityCounter]*counterCell

	reservationSweep fifo[reservationSweepEntry]
	aggregateSweep   fifo[sweepEntry[authority.Fence]]
	terminalSweep    terminalHeap

	watches map[authority.Key]*watch
	// feed is the log of row changes the row feeds read (feed.go).
	feed          feedLog
	feedRetention int
	// obs records operations (nil: nothing is recorded).
	obs *observe.Observer
	// contract is the contract's methods, observed (operations.go).
	contract
	// epoch is the clock's reading at New; reservation deadlines are kept
	// as offsets from it.
	epoch time.Time
}

var (
	_ authority.Store        = (*Store)(nil)
	_ authority.ChangeWaiter = (*Store)(nil)
	_ authority.RowFeed      = (*Store)(nil)
)

// New returns an empty store. It panics if opts.Liveness is nil.
func New(opts Config) *Store {
	if opts.Liveness == nil {
		panic("memory: Config.Liveness is required")
	}
	s := &Store{
		liveness:           opts.Liveness,
		clock:              opts.Clock,
		retention:          opts.ReservationRetention,
		scanRetention:      opts.ScanRetention,
		maxPins:            opts.MaxPinnedScans,
		policy:             opts.CapacityPolicy,
		claims:             opts.IdentityClaims,
		index:              btree.NewBTreeGOptions(rowLess, btree.Options{NoLocks: true}),
		operationTerminals: make(map[string]*authority.TerminalRecord),
		aggregates:         make(map[authority.Fence]*aggregateRecord),
		counters:           make(map[authority.CapacityCounter]*counterCell),
		watches:            make(map[authority.Key]*watch),
		obs:                observe.New(observe.Config{Registerer: opts.Registerer, TracerProvider: opts.TracerProvider, Logger: opts.Logger}),
	}
	s.contract = observe.NewContract(s.obs, s.work())
	s.clock = authority.NewMonotonicClock(s.clock) // expiry never goes back (docs/deviations.md C18)
	s.epoch = s.clock.Now()
	if s.retention <= 0 {
		s.retention = DefaultReservationRetention
	}
	if s.scanRetention <= 0 {
		s.scanRetention = DefaultScanRetention
	}
	// Revision 1 is the empty store (as in etcd): a feed's After of 0
	// means "from now", never a revision.
	s.revision = 1
	s.feedRetention = opts.FeedRetention
	if s.feedRetention <= 0 {
		s.feedRetention = DefaultFeedRetention
	}
	if s.maxPins <= 0 {
		s.maxPins = DefaultMaxPinnedScans
	}
	var seed [16]byte
	if _, err := crand.Read(seed[:]); err != nil {
		panic("memory: no randomness: " + err.Error())
	}
	s.reservations.key = binary.LittleEndian.Uint64(seed[:8])
	s.scope = "memory/" + hex.EncodeToString(seed[8:])
	return s
}

// SetCapacityPolicy replaces the placement capacity policy (nil: every
// placement fits). It is safe to call concurrently with every operation.
func (s *Store) SetCapacityPolicy(policy authority.CapacityPolicy) {
	s.mu.Lock()
	s.policy = policy
	s.mu.Unlock()
}

// SetIdentityClaims replaces the identity claims (nil: nothing is claimed).
// It is safe to call concurrently with every operation.
func (s *Store) SetIdentityClaims(claims authority.IdentityClaims) {
	s.mu.Lock()
	s.claims = claims
	s.mu.Unlock()
}

// lock checks ctx, then takes the store's lock and returns the store's clock
// (the etcd provider's begin only checks: it has no lock).
// Callers validate their input before calling it and unlock when done.
func (s *Store) lock(ctx context.Context) (time.Time, error) {
	if err := ctx.Err(); err != nil {
		return time.Time{}, err
	}
	s.mu.Lock()
	return s.clock.Now(), nil
}

// beginWrite is begin followed by the amortized sweep of expired records.
func (s *Store) beginWrite(ctx context.Context) (time.Time, error) {
	now, err := s.lock(ctx)
	if err == nil {
		s.sweep(now)
	}
	return now, err
}

// version formats a store version counter.
func version(n int64) authority.StoreVersion {
	return authority.StoreVersion(strconv.FormatInt(n, 10))
}

// nextStoreVersion hands out the next store version; ok is false once the
// counter is exhausted.
func (s *Store) nextStoreVersion() (int64, bool) {
	if s.storeVersion >= authority.MaxGeneration {
		return 0, false
	}
	s.storeVersion++
	return s.storeVersion, true
}

// row returns the row at key, or nil. The caller holds s.mu.
func (s *Store) row(key authority.Key) *row {
	s.probe.key = key
	r, _ := s.index.GetHint(&s.probe, &s.hint)
	return r
}

// putRow stores r (a new value) under its key.
func (s *Store) putRow(r *row) {
	_, replaced := s.index.SetHint(r, &s.hint)
	s.changed(r.key)
	r.born = s.revision
	if s.feed.on {
		kind := authority.FeedCreated
		if replaced {
			kind = authority.FeedUpdated
		}
		s.record(kind, r.key, r)
	}
}

// writable reports whether the row value r can be rewritten in place: no
// pinned listing can see it (every pin was taken before r was written) and
// no listing is copying rows outside the lock. The caller holds s.mu.
func (s *Store) writable(r *row) bool {
	return s.copying == 0 && (len(s.pins) == 0 || s.pins[len(s.pins)-1].revision < r.born)
}

// next returns the value to write the next version of r into: r itself
// when it is writable, else a successor. inPlace reports which.
func (s *Store) next(r *row) (next *row, inPlace bool) {
	if s.writable(r) {
		return r, true
	}
	return r.successor(), false
}

// storeNext stores next, the next version of a row, made by next.
func (s *Store) storeNext(next *row, inPlace bool) {
	if !inPlace {
		s.putRow(next)
		return
	}
	s.changed(next.key)
	next.born = s.revision
	if s.feed.on {
		s.record(authority.FeedUpdated, next.key, next)
	}
}

// deleteRow removes the row at r.key.
func (s *Store) deleteRow(r *row) {
	s.index.DeleteHint(r, &s.hint)
	s.changed(r.key)
	if s.feed.on {
		s.record(authority.FeedRemoved, r.key, nil)
	}
}

// changed records a write of key: listings pinned before it keep their copy,
// waiters on key wake up.
func (s *Store) changed(key authority.Key) {
	s.revision++
	if len(s.watches) != 0 {
		s.notify(key)
	}
}

// read returns the row at key, or missing.
func (s *Store) read(key authority.Key, now time.Time) authority.ReadResult {
	r := s.row(key)
	if r == nil {
		return authority.Missing(now)
	}
	return authority.Found(r.snapshot(now))
}

// isOwnerLive reports whether the row's owner is live where the row is
// placed.
func (s *Store) isOwnerLive(snap *authority.Snapshot) bool {
	return s.liveness.IsTargetLive(snap.Allocation.Descriptor, snap.Allocation.DescriptorLifecycleGeneration, snap.Owner())
}

// isCreationTargetLive reports whether a reservation's target is live.
func (s *Store) isCreationTargetLive(t authority.CreationTarget) bool {
	return s.liveness.IsTargetLive(t.Descriptor(), t.NodeLifecycleGeneration, t.Owner)
}

// newReservation opens a reservation and returns its number and its ID, a
// version 4 UUID (reservations.go).
func (s *Store) newReservation() (seq uint64, id uuid.UUID) {
	hi := reservationRandom()
	seq, lo := s.reservations.open(hi)
	return seq, reservationUUID(hi, lo)
}

// uuidTextLen is the length of a UUID's canonical text.
const uuidTextLen = 36

// encodeUUID writes id's canonical text (uuid.UUID.String) into dst.
func encodeUUID(dst *[uuidTextLen]byte, id uuid.UUID) {
	encodeIDHigh(dst, binary.BigEndian.Uint64(id[:8]))
	encodeIDLow(dst, binary.BigEndian.Uint64(id[8:]))
}

// encodeIDHigh writes the text of an ID's first half, hi, into dst: its
// first 19 characters, the hyphen after them included.
func encodeIDHigh(dst *[uuidTextLen]byte, hi uint64) {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], hi)
	hex.Encode(dst[0:8], b[0:4])
	dst[8] = '-'
	hex.Encode(dst[9:13], b[4:6])
	dst[13] = '-'
	hex.Encode(dst[14:18], b[6:8])
	dst[18] = '-'
}

// encodeIDLow writes the text of an ID's second half, lo, into dst: its
// last 17 characters.
func encodeIDLow(dst *[uuidTextLen]byte, lo uint64) {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], lo)
	hex.Encode(dst[19:23], b[0:2])
	dst[23] = '-'
	hex.Encode(dst[24:], b[2:])
}

// parseReservationID decodes text in the canonical form encodeUUID writes
// (lower-case hex, hyphenated). Any other text is no reservation of this
// store: ok is false.
func parseReservationID(text string) (id uuid.UUID, ok bool) {
	if len(text) != uuidTextLen {
		return id, false
	}
	j := 0
	for i := 0; i < uuidTextLen; {
		if i == 8 || i == 13 || i == 18 || i == 23 {
			if text[i] != '-' {
				return id, false
			}
			i++
			continue
		}
		hi, ok1 := lowerHex(text[i])
		lo, ok2 := lowerHex(text[i+1])
		if !ok1 || !ok2 {
			return id, false
		}
		id[j] = hi<<4 | lo
		j++
		i += 2
	}
	return id, true
}

func lowerHex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}
