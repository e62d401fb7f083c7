package etcd

import (
	"context"
	"errors"
	"maps"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/internal/etcdpage"
	"github.com/zlink-systems/authority/provider/etcd/internal/txnkit"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// opsPerRemovedRow is the most removing one row costs in a Txn: the row,
// its capacity entry, its owner index entry and (once per node lifecycle)
// its node's capacity epoch.
const opsPerRemovedRow = 4

// removeAllByOwner deletes every row held by owner (through the owner
// index) with its capacity, in Txns that fit --max-txn-ops, each row fenced
// by its ModRevision. It returns how many rows it removed.
func (s *Store) removeAllByOwner(ctx context.Context, owner authority.OwnerToken) (int64, error) {
	if err := authority.ValidateOwner(owner); err != nil {
		return 0, err
	}
	if err := s.begin(ctx); err != nil {
		return 0, err
	}
	prefix := s.keys.OwnerRowsPrefix(owner)
	batch := max(1, s.maxOps/opsPerRemovedRow)
	var removed int64
	// from moves past each removed page: etcd walks the tombstones of the
	// deleted index entries in a range until compaction, so reading from
	// the prefix every time would cost each read all the pages before it
	// (quadratic in the owner's rows), and a counted range (a plain ranged
	// Get with a limit) would cost every entry after the page.
	// readOwnerIndex streams each page: it costs its own entries. A pass
	// that reaches the end reads once more from the prefix, for rows added
	// behind it meanwhile (that read walks the pass's tombstones once).
	from := prefix
	failures := 0
	for {
		keys, more, err := s.readOwnerIndex(ctx, prefix, from)
		if err != nil {
			return removed, err
		}
		if len(keys) == 0 {
			if from == prefix {
				return removed, nil
			}
			from = prefix
			continue
		}
		n, done, err := s.removeIndexed(ctx, owner, keys, batch, &failures)
		removed += n
		if err != nil {
			return removed, err
		}
		if from = prefix + string(keys[done-1]) + "\x00"; !more {
			from = prefix
		}
	}
}

// removeIndexed removes owner's rows at keys (one page of its index, in
// order) in Txns of batch rows, and returns how many rows it removed and
// how many keys it got through. A Txn that failed because a row changed
// between its read and the Txn is tried again, re-read, until failures
// reaches maxAttempts over the whole removal.
func (s *Store) removeIndexed(ctx context.Context, owner authority.OwnerToken, keys []authority.Key, batch int, failures *int) (removed int64, done int, err error) {
	for done < len(keys) {
		part := keys[done:min(done+batch, len(keys))]
		gets := make([]clientv3.Op, len(part))
		for i, key := range part {
			gets[i] = opGet(s.keys.Row(key))
		}
		got, err := s.readInParts(ctx, gets)
		if err != nil {
			return removed, done, err
		}
		t, n, err := s.buildOwnerRemoval(owner, part, got)
		if err != nil {
			return removed, done, err
		}
		resp, err := s.sendWrite(ctx, t, "removing an owner's rows")
		if errors.Is(err, rpctypes.ErrNoSpace) && len(t.Touches) > 0 {
			resp, err = s.sendWrite(ctx, deletesOnly(t), "removing an owner's rows")
		}
		if err != nil {
			return removed, done, err
		}
		if !resp.Succeeded { // a row changed between the read and the Txn: read again
			if *failures++; *failures >= maxAttempts {
				return removed, done, authority.Wrap(authority.ErrUnavailable, "removeAllByOwner gave up after repeated contention", errContention)
			}
			continue
		}
		removed += n
		done += len(part)
	}
	return removed, done, nil
}

// buildOwnerRemoval builds the Txn that removes owner's rows at keys, as
// read in got: each row, its capacity entry and its owner index entry,
// fenced by the row's ModRevision and its row lock's absence (a stale index
// entry is dropped, fenced on the row's ModRevision). n is how many rows it
// removes.
func (s *Store) buildOwnerRemoval(owner authority.OwnerToken, keys []authority.Key, got txnkit.Reads) (t *txnkit.Txn, n int64, err error) {
	t = &txnkit.Txn{}
	for _, key := range keys {
		r, err := s.rowIn(got, key)
		if err != nil {
			return nil, 0, err
		}
		rowKey := s.keys.Row(key)
		if r == nil || r.Owner != owner {
			// a stale index entry (cannot happen through this store)
			var rev int64
			if r != nil {
				rev = r.ModRev
			}
			t.Cmp(modRevIs(rowKey, rev))
			t.Del(s.keys.OwnerRow(owner, key))
			continue
		}
		t.Cmp(modRevIs(rowKey, r.ModRev))
		s.lockFree(t, key)
		t.Del(rowKey)
		t.Del(s.keys.CapacityRow(r.Alloc, key))
		s.touchCapacity(t, r.Alloc)
		t.Del(s.keys.OwnerRow(owner, key))
		n++
	}
	return t, n, nil
}

// readInParts reads the single-key gets and returns what they read, by key:
// in one Txn, or, when the rows add up to more than the client's receive
// limit, in halves, down to one row a read (only a single row over the limit
// is ErrLimitExceeded). The parts need not share a revision: every row read
// is then fenced by its own ModRevision.
func (s *Store) readInParts(ctx context.Context, gets []clientv3.Op) (txnkit.Reads, error) {
	resp, err := s.read(ctx, gets...)
	if err == nil {
		return txnkit.ReadsOf(resp), nil
	}
	if len(gets) == 1 || !errors.Is(err, authority.ErrLimitExceeded) || !etcdpage.TooLarge(err) {
		return nil, err
	}
	half := len(gets) / 2
	first, err := s.readInParts(ctx, gets[:half])
	if err != nil {
		return nil, err
	}
	rest, err := s.readInParts(ctx, gets[half:])
	if err != nil {
		return nil, err
	}
	maps.Copy(first, rest)
	return first, nil
}

// deletesOnly returns t without its capacity epoch touches, the only puts
// of a removal: over its space quota (NOSPACE alarm) etcd refuses every Txn
// that puts a key, and takes those that only delete, which is how space is
// freed. Removing capacity entries without moving the node's epoch is safe:
// a decision fenced on the unmoved epoch counted the removed entries as
// used, so it admitted no more than with them gone (it may admit less until
// the next capacity change moves the epoch, or the usage watch applies the
// deletes). The first attempt may itself have been applied (etcd answers
// NOSPACE to the write that crossed the quota after applying it): the rows'
// compares then fail and the caller reads them again.
func deletesOnly(t *txnkit.Txn) *txnkit.Txn {
	c := t.Clone()
	c.Touches = nil
	return c
}
