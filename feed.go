package authority

import (
	"context"
	"errors"
)

// ErrFeedCompacted reports that the history a row feed needed is gone (etcd
// compacted past the feed's position; the memory store's feed retention
// dropped it). The feed ends; the consumer relists: it opens a new feed with
// FeedRequest.List and replaces what it holds with that listing. A feed never
// skips the gap silently.
var ErrFeedCompacted = errors.New("authority: feed history compacted; relist")

// RowFeed is an optional capability: a typed, ordered change feed of the
// rows under a key prefix, and the store's current revision, the two things
// a local read view of the rows needs (package view).
type RowFeed interface {
	// WatchRows opens a feed of the rows whose key starts with req.Prefix.
	// The feed delivers, in commit order and each exactly once, every
	// change after its start: the listing's revision (req.List), req.After,
	// or the store's revision when the feed opens. A req.After older than
	// the store keeps is ErrFeedCompacted, from WatchRows or from the
	// feed's first Next.
	WatchRows(ctx context.Context, req FeedRequest) (Feed, error)
	// FeedRevision returns the store's current revision, read
	// linearizably: every change committed before the call has a revision
	// at most the result. It is the cheapest request that says so.
	FeedRevision(ctx context.Context) (int64, error)
}

// FeedRequest says which rows a feed follows and from where.
type FeedRequest struct {
	// Prefix selects the rows whose key starts with it (empty: every row);
	// it must not contain NUL.
	Prefix string
	// List starts the feed with a listing: FeedListed batches holding
	// every row under Prefix at one revision, then a FeedSynced batch at
	// that revision, then the changes after it. After must then be 0.
	List bool
	// After starts the feed after this revision (an earlier batch's
	// Revision): the first change delivered is the first one committed
	// after it. 0 (without List): start at the store's revision when the
	// feed opens. Negative is ErrInvalidArgument.
	After int64
	// AfterPosition resumes a FeedPositioner's feed after a position (an
	// earlier batch's Position): the first change delivered is the first
	// one after it in any sequence. List must be false and After 0. A store
	// of one revision sequence refuses it (ErrInvalidArgument): resume it
	// with After.
	AfterPosition FeedPosition
	// KeepUndecodable delivers a row the store cannot decode as an event
	// with Undecodable set (and no Snapshot), and goes on; without it such
	// a row ends the feed with its ErrCorrupt. For tools that show what is
	// stored (authorityctl watch); a cache must not skip a row.
	KeepUndecodable bool
}

// FeedBatchKind says what a FeedBatch holds.
type FeedBatchKind string

// The batch kinds.
const (
	// FeedListed holds rows of the initial listing (each a FeedCreated
	// event at the batch's Revision); more FeedListed batches may follow,
	// then FeedSynced.
	FeedListed FeedBatchKind = "listed"
	// FeedSynced ends the initial listing: the rows of its FeedListed
	// batches are every row under the prefix at Revision. It has no
	// events.
	FeedSynced FeedBatchKind = "synced"
	// FeedChanged holds changes, in commit order: every change under the
	// prefix after the previous batch's Revision, through this one's.
	FeedChanged FeedBatchKind = "changed"
	// FeedProgress holds no events: nothing under the prefix changed after
	// the previous batch's Revision, through this one's. The first batch of
	// a feed without List is one (its start).
	FeedProgress FeedBatchKind = "progress"
)

// FeedEventKind names a row change.
type FeedEventKind string

// The row changes.
const (
	// FeedCreated: the row was created (or listed).
	FeedCreated FeedEventKind = "created"
	// FeedUpdated: an existing row was rewritten.
	FeedUpdated FeedEventKind = "updated"
	// FeedRemoved: the row was removed (abort, failed completion, delete,
	// removeAllByOwner, expiry).
	FeedRemoved FeedEventKind = "removed"
)

// FeedEvent is one row change.
type FeedEvent struct {
	// Kind is created, updated or removed.
	Kind FeedEventKind
	// Key is the row's key.
	Key Key
	// Snapshot is the row after the change (its StoreVersion and
	// OwnershipToken included; StoreNow is the feed's clock when it decoded
	// the change); nil when removed.
	Snapshot *Snapshot
	// Revision is the revision of the commit that made the change (etcd:
	// its revision, shared by every row of one Txn; memory: its write
	// counter).
	Revision int64
	// Undecodable is the ErrCorrupt of a row the store could not decode
	// (only with FeedRequest.KeepUndecodable; Snapshot is then nil).
	Undecodable error
}

// FeedBatch is what a feed delivers at a time.
type FeedBatch struct {
	// Kind says what the batch holds.
	Kind FeedBatchKind
	// Events are the batch's changes or listed rows.
	Events []FeedEvent
	// Revision is how far the feed has come: after this batch the consumer
	// has seen every change under the prefix up to and including Revision
	// (for FeedListed and FeedSynced, the listing's revision). It never
	// decreases along a feed; resume a feed after it with
	// FeedRequest.After.
	Revision int64
	// Position is set by a FeedPositioner's feed on every batch but a
	// FeedListed one: how far the feed has come in each of the store's
	// revision sequences (Revision is its Sum). Resume after it with
	// FeedRequest.AfterPosition. Nil for a store of one revision sequence.
	Position FeedPosition
}

// Feed is an open row feed. Next is called from one goroutine at a time;
// RequestProgress and Close from any.
type Feed interface {
	// Next returns the next batch, waiting until there is one or ctx ends
	// (ctx.Err()). ErrFeedCompacted means the history is gone: relist.
	// After Close it reports ErrClosed; a store that fails reports its
	// error (ErrUnavailable, ErrCorrupt for a row it cannot decode): the
	// feed is then over, resume it from the last batch's Revision.
	Next(ctx context.Context) (FeedBatch, error)
	// RequestProgress asks the feed to deliver, soon, a batch whose
	// Revision is at least the revision of the serving store at the call
	// (a FeedProgress batch when nothing changed). ErrUnsupportedServer
	// means the store cannot promise that (etcd before 3.4.31 / 3.5.13,
	// whose progress notifications may run ahead of undelivered events).
	RequestProgress(ctx context.Context) error
	// Close ends the feed and releases its resources.
	Close() error
}

// ValidateFeedRequest checks a FeedRequest (ErrInvalidArgument).
func ValidateFeedRequest(req FeedRequest) error {
	for i := 0; i < len(req.Prefix); i++ {
		if req.Prefix[i] == 0 {
			return Invalid("Feed prefix must not contain NUL.")
		}
	}
	if req.After < 0 {
		return Invalid("Feed After must be a revision ≥ 0.")
	}
	if req.List && req.After != 0 {
		return Invalid("Feed List starts at the listing's revision: After must be 0.")
	}
	if req.AfterPosition != nil {
		return Invalid("Feed AfterPosition is for a store of several revision sequences (FeedPositioner); this store resumes with After.")
	}
	return nil
}
