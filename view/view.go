// Package view is a local read view of authority rows: it keeps the decoded
// rows under a prefix in memory, kept current by the store's row feed
// (authority.RowFeed), and answers ReadAuthority and ListAuthorities from
// memory with the contract's semantics.
//
// A consistent read (the default) is linearizable, like the store's own
// reads. It learns the store's current revision with one cheap request
// (FeedRevision) shared by every read that waits at that moment, waits until
// the view has applied that revision (asking the feed for progress when no
// change carries it there), then answers from memory. A bounded-stale read
// answers at once when the view was known to be current within the caller's
// bound, and otherwise reads consistently. Every answer says which revision
// it reflects.
//
// When the feed's history is gone (authority.ErrFeedCompacted), or a feed
// fails before its listing ends, the view lists again; a feed that fails
// otherwise is resumed after the applied revision.
//
// # Fallback to the store
//
// A consistent answer from memory needs a freshness fence: the feed's
// promise (Feed.RequestProgress) that it delivered every change up to the
// store's revision. When the feed cannot give one (etcd before 3.4.31 /
// 3.5.13, whose progress notifications may run ahead of undelivered
// events: RequestProgress reports authority.ErrUnsupportedServer), New
// still starts the view, and every consistent read and first listing page
// is answered by the store instead (FromStore set); bounded-stale reads too,
// since the view is then never known current. The same happens to a read
// whose view does not catch up within Config.MaxWait.
package view

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/tidwall/btree"

	authority "github.com/zlink-systems/authority"
)

// DefaultMaxWait is Config.MaxWait when it is 0.
const DefaultMaxWait = 3 * time.Second

// Store is what a view reads: a store with the row feed capability.
type Store interface {
	authority.AuthorityStore
	authority.RowFeed
}

// Config configures a View.
type Config struct {
	// Prefix selects the rows the view keeps (empty: every row); it must
	// not contain NUL.
	Prefix string
	// MaxWait bounds how long a consistent read waits for the view to
	// reach the store's revision before it reads the store instead (0:
	// DefaultMaxWait).
	MaxWait time.Duration
	// Clock stamps the answers' StoreNow (nil: the wall clock).
	Clock authority.Clock
}

// Freshness says how current an answer must be. The zero value asks for a
// consistent (linearizable) answer.
type Freshness struct {
	// MaxStaleness, when positive, accepts an answer that reflects the
	// store as it was at most this long ago.
	MaxStaleness time.Duration
}

// Read is a view's answer to a row read.
type Read struct {
	authority.ReadResult
	// Revision is the store revision the answer reflects: the row as it
	// was at that revision. For an answer from the store, a revision the
	// store had reached before it read the row (the row is as of that
	// revision or later). On a store of several revision sequences
	// (authority.FeedPositioner) it is the sum of the position's revisions.
	Revision int64
	// FromStore is set when the answer came from the store, not memory
	// (no progress promises, or the view did not catch up in time).
	FromStore bool
}

// Page is a view's answer to a listing page.
type Page struct {
	authority.ScanResult
	// Revision is the store revision every page of the listing reflects
	// (from the store: the revision its cursor names, or, for a listing of
	// one page, a revision the store had reached before it listed).
	Revision int64
	// FromStore is set when the page came from the store.
	FromStore bool
}

// entry is one cached row.
type entry struct {
	key  authority.Key
	snap *authority.Snapshot
}

func entryLess(a, b entry) bool { return a.key < b.key }

type tree = btree.BTreeG[entry]

func newTree() *tree { return btree.NewBTreeGOptions(entryLess, btree.Options{NoLocks: true}) }

// state is what the view has applied: rows is never changed once
// published (the follower changes a copy-on-write copy of its own), so a
// read loads one pointer and takes no lock.
type state struct {
	rows    *tree
	applied int64
	// pos is the position applied, on a store that is an
	// authority.FeedPositioner (nil otherwise).
	pos authority.FeedPosition
}

// View is a local read view. It is safe for concurrent use.
type View struct {
	store   Store
	prefix  string
	maxWait time.Duration
	clock   authority.Clock
	// sysClock is set when clock is the wall clock: a read then reads it
	// once, for its staleness and its answer's StoreNow.
	sysClock bool
	scope    string

	life   context.Context
	cancel context.CancelFunc
	// endFirstFeed ends the context of the feed New opened.
	endFirstFeed context.CancelFunc
	wg           sync.WaitGroup

	cur atomic.Pointer[state]
	// freshAt is when the view was last known current: the start of the
	// last revision check whose revision it applied (nil: never).
	freshAt atomic.Pointer[time.Time]
	// noProgress is set once the feed said it cannot promise progress.
	noProgress atomic.Bool
	// failed holds the error that ends the view's reads (ErrClosed).
	failed atomic.Pointer[error]
	// synced is closed once the first listing is applied.
	synced     chan struct{}
	syncedOnce sync.Once

	mu sync.Mutex
	// changed is closed (and replaced) whenever the view applies a batch
	// or fails.
	changed chan struct{}

	pinMu sync.Mutex
	pins  []pin

	relists, resumes, storeReads atomic.Int64

	feedMu sync.Mutex
	feed   authority.Feed
	// askedRev and askedAt are the last progress request (under feedMu).
	askedRev int64
	askedAt  time.Time

	flights flights
	// positioner is the store as an authority.FeedPositioner (nil when it
	// is not one): consistency then waits for a position, not a revision.
	positioner authority.FeedPositioner
}

// New starts a view of store's rows under cfg.Prefix: it lists them and
// follows the feed from the listing's revision. It returns once the listing
// is applied (or ctx ends). Close it when done.
func New(ctx context.Context, store Store, cfg Config) (*View, error) {
	if err := authority.ValidateFeedRequest(authority.FeedRequest{Prefix: cfg.Prefix}); err != nil {
		return nil, err
	}
	v := &View{
		store: store, prefix: cfg.Prefix, maxWait: cfg.MaxWait, clock: cfg.Clock,
		changed: make(chan struct{}), synced: make(chan struct{}),
	}
	v.cur.Store(&state{rows: newTree()})
	if v.maxWait <= 0 {
		v.maxWait = DefaultMaxWait
	}
	if v.clock == nil {
		v.clock = authority.SystemClock{}
	}
	_, v.sysClock = v.clock.(authority.SystemClock)
	v.scope = "view/" + uuid.NewString()
	v.life, v.cancel = context.WithCancel(context.WithoutCancel(ctx))
	v.flights.v = v
	v.positioner, _ = store.(authority.FeedPositioner)
	// The feed lives as long as the view; only its listing is bounded by
	// ctx (the feed's context ends with ctx until WatchRows returned).
	fctx, fcancel := context.WithCancel(v.life)
	detach := context.AfterFunc(ctx, fcancel)
	feed, err := store.WatchRows(fctx, authority.FeedRequest{Prefix: cfg.Prefix, List: true})
	if !detach() && err == nil {
		_ = feed.Close()
		err = ctx.Err()
	}
	if err != nil {
		fcancel()
		v.cancel()
		return nil, err
	}
	v.feed, v.endFirstFeed = feed, fcancel
	if err := feed.RequestProgress(ctx); errors.Is(err, authority.ErrUnsupportedServer) {
		v.noProgress.Store(true) // consistent reads go to the store
	}
	v.wg.Add(1)
	go v.follow(feed)
	if err := v.waitSynced(ctx); err != nil {
		_ = v.Close()
		return nil, err
	}
	return v, nil
}

// waitSynced waits until the view applied its first listing, ctx ends, or
// the view fails (its store closed).
func (v *View) waitSynced(ctx context.Context) error {
	for {
		v.mu.Lock()
		ch := v.changed
		v.mu.Unlock()
		select {
		case <-v.synced:
			return nil
		default:
		}
		if err := v.err(); err != nil {
			return err
		}
		select {
		case <-v.synced:
			return nil
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Close stops the view. Reads after Close, and reads waiting when it is
// called, report authority.ErrClosed.
func (v *View) Close() error {
	v.flights.mu.Lock()
	v.flights.closed = true
	v.flights.mu.Unlock()
	// before the view's context ends: a read whose revision request or
	// wait that ending cuts short reports ErrClosed, not the cancellation
	v.fail(authority.ErrClosed)
	v.cancel()
	if v.endFirstFeed != nil {
		v.endFirstFeed()
	}
	v.feedMu.Lock()
	if v.feed != nil {
		_ = v.feed.Close()
	}
	v.feedMu.Unlock()
	v.wg.Wait()
	return nil
}

// fail ends the view's reads with err (the first error set stays).
func (v *View) fail(err error) {
	v.failed.CompareAndSwap(nil, &err)
	v.mu.Lock()
	v.signal()
	v.mu.Unlock()
}

// err returns the error that ended the view's reads, or nil.
func (v *View) err() error {
	if p := v.failed.Load(); p != nil {
		return *p
	}
	return nil
}

// Revision returns the revision the view has applied.
func (v *View) Revision() int64 { return v.cur.Load().applied }

// Stats counts what a view did.
type Stats struct {
	// Relists counts the listings after the first: the feed's history
	// was gone, or a feed failed before its listing ended.
	Relists int64
	// Resumes counts the feeds reopened after the applied revision, after
	// one failed otherwise (lost leader, dropped stream).
	Resumes int64
	// StoreReads counts the reads and first pages answered by the store
	// (no progress promises, or not caught up within MaxWait).
	StoreReads int64
}

// Stats returns what the view did so far.
func (v *View) Stats() Stats {
	return Stats{Relists: v.relists.Load(), Resumes: v.resumes.Load(), StoreReads: v.storeReads.Load()}
}

// Relists returns how many times the view listed again (Stats.Relists).
func (v *View) Relists() int { return int(v.relists.Load()) }

// ReadAuthority reads the row at key consistently (authority.AuthorityStore
// semantics): the answer of Read with the zero Freshness.
func (v *View) ReadAuthority(ctx context.Context, key authority.Key) (authority.ReadResult, error) {
	r, err := v.Read(ctx, key, Freshness{})
	return r.ReadResult, err
}

// Read reads the row at key, as fresh as f asks.
func (v *View) Read(ctx context.Context, key authority.Key, f Freshness) (Read, error) {
	if err := authority.ValidateKey(key); err != nil {
		return Read{}, err
	}
	if !strings.HasPrefix(string(key), v.prefix) {
		return Read{}, authority.Invalid("Key " + string(key) + " is outside the view's prefix " + v.prefix + ".")
	}
	st, now, rev, fromStore, err := v.ready(ctx, f)
	if err != nil {
		return Read{}, err
	}
	if fromStore {
		v.storeReads.Add(1)
		res, err := v.store.ReadAuthority(ctx, key)
		return Read{ReadResult: res, Revision: rev, FromStore: true}, err
	}
	if !v.sysClock || now.IsZero() {
		now = v.clock.Now()
	}
	e, ok := st.rows.Get(entry{key: key})
	if !ok {
		return Read{ReadResult: authority.Missing(now), Revision: st.applied}, nil
	}
	return Read{ReadResult: authority.Found(copySnapshot(e.snap, now)), Revision: st.applied}, nil
}

// copySnapshot returns a caller-owned copy of s stamped with now: one
// allocation for a row whose payload (and request digest) fit inline
// (inlineBytes), one more for a larger one or a pending creation.
func copySnapshot(s *authority.Snapshot, now time.Time) *authority.Snapshot {
	box := &snapBox{snap: *s}
	c := &box.snap
	c.StoreNow = now
	var sha []byte
	if p := s.PendingCreation; p != nil {
		pc := *p
		c.PendingCreation = &pc
		sha = p.RequestSHA256
	}
	if st := s.Allocation.Capacity.SpotType; st != nil {
		box.spot = *st
		c.Allocation.Capacity.SpotType = &box.spot
	}
	n := len(s.Payload) + len(sha)
	buf := box.buf[:]
	if n > len(buf) {
		buf = make([]byte, n)
	}
	if s.Payload != nil {
		c.Payload = buf[:copy(buf, s.Payload):len(s.Payload)]
	}
	if sha != nil {
		c.PendingCreation.RequestSHA256 = buf[len(s.Payload):n:n]
		copy(c.PendingCreation.RequestSHA256, sha)
	}
	return c
}

// inlineBytes is how many payload and digest bytes a read's copy holds
// without an allocation of their own.
const inlineBytes = 16

// snapBox is a read's copy of a row, with room for its Spot type and a
// small payload.
type snapBox struct {
	snap authority.Snapshot
	spot authority.SpotTypeCapacity
	buf  [inlineBytes]byte
}

// ready makes the view fresh enough for f and returns the state to answer
// from: at once when it was known current within f's bound, else after a
// consistency check. now is the wall clock a bounded-stale check read
// (zero otherwise). fromStore is set when the caller must read the store
// instead; rev is then the revision the check learned.
func (v *View) ready(ctx context.Context, f Freshness) (st *state, now time.Time, rev int64, fromStore bool, err error) {
	if err := v.err(); err != nil {
		return nil, now, 0, false, err
	}
	if f.MaxStaleness > 0 {
		if fresh := v.freshAt.Load(); fresh != nil {
			now = time.Now()
			if now.Sub(*fresh) <= f.MaxStaleness {
				return v.cur.Load(), now, 0, false, nil
			}
		}
	}
	rev, pos, start, err := v.flights.revision(ctx)
	if err != nil {
		return nil, now, 0, false, err
	}
	if v.noProgress.Load() {
		return nil, now, rev, true, nil
	}
	wctx, cancel := context.WithTimeout(ctx, v.maxWait)
	defer cancel()
	err = v.waitApplied(wctx, rev, pos)
	switch {
	case err == nil:
		v.markFresh(start)
		return v.cur.Load(), time.Time{}, rev, false, nil
	case ctx.Err() != nil:
		return nil, now, 0, false, ctx.Err()
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, authority.ErrUnsupportedServer):
		return nil, now, rev, true, nil
	}
	return nil, now, 0, false, err
}

// markFresh records that the view was current at start, unless it is
// known current at a later time.
func (v *View) markFresh(start time.Time) {
	for {
		old := v.freshAt.Load()
		if old != nil && !start.After(*old) {
			return
		}
		if v.freshAt.CompareAndSwap(old, &start) {
			return
		}
	}
}

// waitApplied waits until the view applied rev (and, on a
// FeedPositioner, pos), asking the feed for progress when it is behind.
func (v *View) waitApplied(ctx context.Context, rev int64, pos authority.FeedPosition) error {
	var asked time.Time
	for {
		v.mu.Lock()
		ch := v.changed
		v.mu.Unlock()
		if err := v.err(); err != nil {
			return err
		}
		if cur := v.cur.Load(); cur.applied >= rev && (pos == nil || cur.pos.Covers(pos)) {
			return nil
		}
		if v.noProgress.Load() {
			return authority.ErrUnsupportedServer
		}
		if time.Since(asked) > progressRetry {
			asked = time.Now()
			v.requestProgress(ctx, rev)
		}
		t := time.NewTimer(progressRetry)
		select {
		case <-ch:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			if err := v.err(); err != nil {
				return err
			}
			return ctx.Err()
		}
		t.Stop()
	}
}

// progressRetry is how long a wait gives a progress request before it asks
// again (the member serving the watch may be behind the one that answered
// the revision).
const progressRetry = 100 * time.Millisecond

// requestProgress asks the current feed for progress up to rev, unless a
// request for rev or later went out within progressRetry (the waiters of
// one revision check share one request); a feed that cannot promise it
// turns the view's consistent reads to the store.
func (v *View) requestProgress(ctx context.Context, rev int64) {
	v.feedMu.Lock()
	feed := v.feed
	if feed == nil || rev <= v.askedRev && time.Since(v.askedAt) < progressRetry {
		v.feedMu.Unlock()
		return
	}
	v.askedRev, v.askedAt = max(v.askedRev, rev), time.Now()
	v.feedMu.Unlock()
	if err := feed.RequestProgress(ctx); errors.Is(err, authority.ErrUnsupportedServer) {
		v.noProgress.Store(true)
		v.mu.Lock()
		v.signal()
		v.mu.Unlock()
	}
}

// signal wakes the waiters. The caller holds v.mu.
func (v *View) signal() {
	close(v.changed)
	v.changed = make(chan struct{})
}
