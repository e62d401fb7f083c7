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
// When the feed's history is gone (authority.ErrFeedCompacted) the view
// relists; when the store cannot make progress promises (etcd before 3.4.31
// / 3.5.13), or the view does not catch up within Config.MaxWait, consistent
// reads go to the store instead.
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
	// was at that revision.
	Revision int64
	// FromStore is set when the answer came from the store, not memory
	// (no progress promises, or the view did not catch up in time).
	FromStore bool
}

// Page is a view's answer to a listing page.
type Page struct {
	authority.ScanResult
	// Revision is the store revision every page of the listing reflects.
	Revision int64
	// FromStore is set when the page came from the store.
	FromStore bool
}

// entry is one cached row.
type entry struct {
	key  authority.Key
	snap *authority.Snapshot
}

func entryLess(a, b *entry) bool { return a.key < b.key }

// View is a local read view. It is safe for concurrent use.
type View struct {
	store   Store
	prefix  string
	maxWait time.Duration
	clock   authority.Clock
	scope   string

	life   context.Context
	cancel context.CancelFunc
	// endFirstFeed ends the context of the feed New opened.
	endFirstFeed context.CancelFunc
	wg           sync.WaitGroup

	mu      sync.RWMutex
	rows    *btree.BTreeG[*entry]
	applied int64
	// freshAt is when the view was last known current: the start of the
	// last revision check whose revision it applied.
	freshAt time.Time
	// changed is closed (and replaced) whenever applied moves or the view
	// fails.
	changed chan struct{}
	// noProgress is set once the feed said it cannot promise progress.
	noProgress bool
	err        error
	pins       []pin

	relists, resumes, storeReads atomic.Int64

	feedMu sync.Mutex
	feed   authority.Feed
	// askedRev and askedAt are the last progress request (under feedMu).
	askedRev int64
	askedAt  time.Time

	flights flights
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
		rows:    btree.NewBTreeGOptions(entryLess, btree.Options{NoLocks: true}),
		changed: make(chan struct{}),
	}
	if v.maxWait <= 0 {
		v.maxWait = DefaultMaxWait
	}
	if v.clock == nil {
		v.clock = authority.SystemClock{}
	}
	v.scope = "view/" + uuid.NewString()
	v.life, v.cancel = context.WithCancel(context.WithoutCancel(ctx))
	v.flights.v = v
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
		v.noProgress = true // consistent reads go to the store
	}
	v.wg.Add(1)
	go v.follow(feed)
	if err := v.waitApplied(ctx, 1); err != nil {
		_ = v.Close()
		return nil, err
	}
	return v, nil
}

// Close stops the view. Reads after Close report authority.ErrClosed.
func (v *View) Close() error {
	v.flights.mu.Lock()
	v.flights.closed = true
	v.flights.mu.Unlock()
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
	v.mu.Lock()
	if v.err == nil {
		v.err = authority.ErrClosed
	}
	v.mu.Unlock()
	return nil
}

// Revision returns the revision the view has applied.
func (v *View) Revision() int64 {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.applied
}

// Stats counts what a view did.
type Stats struct {
	// Relists counts the listings after the feed's history was gone.
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

// Relists returns how many times the view relisted after its feed's history
// was gone.
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
	rev, fromStore, err := v.ready(ctx, f)
	if err != nil {
		return Read{}, err
	}
	if fromStore {
		v.storeReads.Add(1)
		res, err := v.store.ReadAuthority(ctx, key)
		return Read{ReadResult: res, Revision: rev, FromStore: true}, err
	}
	v.mu.RLock()
	e, ok := v.rows.Get(&entry{key: key})
	applied := v.applied
	v.mu.RUnlock()
	now := v.clock.Now()
	if !ok {
		return Read{ReadResult: authority.Missing(now), Revision: applied}, nil
	}
	s := e.snap.Clone()
	s.StoreNow = now
	return Read{ReadResult: authority.Found(s), Revision: applied}, nil
}

// ready makes the view fresh enough for f: at once when it was known
// current within f's bound, else after a consistency check. fromStore is
// set when the caller must read the store instead; rev is then the
// revision the check learned.
func (v *View) ready(ctx context.Context, f Freshness) (rev int64, fromStore bool, err error) {
	v.mu.RLock()
	fresh, applied, noProgress, verr := v.freshAt, v.applied, v.noProgress, v.err
	v.mu.RUnlock()
	if verr != nil {
		return 0, false, verr
	}
	if f.MaxStaleness > 0 && !fresh.IsZero() && time.Since(fresh) <= f.MaxStaleness {
		return applied, false, nil
	}
	rev, start, err := v.flights.revision(ctx)
	if err != nil {
		return 0, false, err
	}
	if noProgress {
		return rev, true, nil
	}
	wctx, cancel := context.WithTimeout(ctx, v.maxWait)
	defer cancel()
	err = v.waitApplied(wctx, rev)
	switch {
	case err == nil:
		v.mu.Lock()
		if start.After(v.freshAt) {
			v.freshAt = start
		}
		v.mu.Unlock()
		return rev, false, nil
	case ctx.Err() != nil:
		return 0, false, ctx.Err()
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, authority.ErrUnsupportedServer):
		return rev, true, nil
	}
	return 0, false, err
}

// waitApplied waits until the view applied rev, asking the feed for
// progress when it is behind.
func (v *View) waitApplied(ctx context.Context, rev int64) error {
	var asked time.Time
	for {
		v.mu.RLock()
		applied, ch, err, noProgress := v.applied, v.changed, v.err, v.noProgress
		v.mu.RUnlock()
		if err != nil {
			return err
		}
		if applied >= rev {
			return nil
		}
		if noProgress {
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
		v.mu.Lock()
		v.noProgress = true
		v.signal()
		v.mu.Unlock()
	}
}

// signal wakes the waiters. The caller holds v.mu.
func (v *View) signal() {
	close(v.changed)
	v.changed = make(chan struct{})
}
