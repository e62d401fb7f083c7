package authority

import (
	"context"
	"fmt"
)

// FeedPositioner is an optional capability of a RowFeed whose store orders
// its changes in more than one revision sequence (provider/sharded: one per
// shard, each an etcd cluster's revisions). Changes of different sequences
// have no order between them, so one revision cannot say how far a feed has
// come: the store's feeds put a FeedPosition, one revision per sequence, on
// every batch but a FeedListed one (FeedBatch.Position), and resume after one
// (FeedRequest.AfterPosition).
//
// Their batches' and events' Revision, and FeedRevision, are then the sum
// of a position's revisions: it only grows along a feed (so it orders a
// feed's batches and events as the contract says), but a feed whose Revision
// reached a FeedRevision has not necessarily seen every change committed
// before that call. A consumer that needs that (package view's consistent
// reads) asks FeedPosition and waits until a batch's Position Covers it.
type FeedPositioner interface {
	// FeedPosition returns the store's current position, each sequence's
	// revision read linearizably: every change committed before the call
	// is at or before it in its sequence.
	FeedPosition(ctx context.Context) (FeedPosition, error)
}

// FeedPosition is a position in a store of several revision sequences: one
// revision per sequence, in the store's order (see FeedPositioner).
type FeedPosition []int64

// Covers reports whether p is at or after q in every sequence (p and q of
// one store have the same length; positions of different lengths never
// cover each other).
func (p FeedPosition) Covers(q FeedPosition) bool {
	if len(p) != len(q) {
		return false
	}
	for i := range p {
		if p[i] < q[i] {
			return false
		}
	}
	return true
}

// Sum returns the sum of p's revisions: the Revision a positioned feed
// reports with it.
func (p FeedPosition) Sum() int64 {
	var n int64
	for _, r := range p {
		n += r
	}
	return n
}

// Clone returns a copy of p.
func (p FeedPosition) Clone() FeedPosition {
	if p == nil {
		return nil
	}
	return append(FeedPosition(nil), p...)
}

// ValidatePositionedFeedRequest checks a FeedRequest to a FeedPositioner of
// sequences revision sequences (ErrInvalidArgument): ValidateFeedRequest's
// rules, and an AfterPosition (with After 0 and no List) of one revision ≥ 1
// per sequence.
func ValidatePositionedFeedRequest(req FeedRequest, sequences int) error {
	pos := req.AfterPosition
	req.AfterPosition = nil
	if err := ValidateFeedRequest(req); err != nil {
		return err
	}
	if pos == nil {
		return nil
	}
	if req.List || req.After != 0 {
		return Invalid("Feed AfterPosition resumes a feed: List must be false and After 0.")
	}
	if len(pos) != sequences {
		return Invalid(fmt.Sprintf("Feed AfterPosition has %d revisions; this store has %d revision sequences.", len(pos), sequences))
	}
	for i, r := range pos {
		if r < 1 {
			return Invalid(fmt.Sprintf("Feed AfterPosition's revision %d is %d, not ≥ 1.", i, r))
		}
	}
	return nil
}
