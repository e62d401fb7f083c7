package etcd

import (
	"context"
	"errors"
	"maps"
	"strings"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/internal/etcdpage"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// opsPerRemovedRow is the most removing one row costs in a Txn: the row,
// its capacity entry, its owner index entry and (once per node lifecycle)
// its node's capacity epoch.
const opsPerRemovedRow = 4

// removeIndexPageMax is the most owner index keys one read of
// removeAllByOwner takes (keys only: ≈ 100 B each).
const removeIndexPageMax = 16384

// removeAllByOwner deletes every row held by owner (through the owner
// index) with its capacity, in Txns that fit --max-txn-ops, each row fenced
// by its ModRevision. It returns how many rows it removed.
//
// The index is read in pages that grow (one batch, then doubling up to
// removeIndexPageMax keys), each page removed batch by batch. Every range
// etcd answers with a limit still walks the whole rest of the range in its
// key index to count it, so one read a batch cost each batch all the
// owner's remaining rows: quadratic in them (100k rows at 712 rows/s).
// Each page reads from after the last one: etcd also walks the tombstones
// of the deleted index entries until compaction. A pass that reaches the
// end reads once more from the prefix, for rows added behind it meanwhile.
func (s *Store) removeAllByOwner(ctx context.Context, owner authority.OwnerToken) (int64, error) {
	if err := authority.ValidateOwner(owner); err != nil {
		return 0, err
	}
	if err := s.begin(ctx); err != nil {
		return 0, err
	}
	prefix := s.keys.ownerRowsPrefix(owner)
	batch := max(1, s.maxOps/opsPerRemovedRow)
	page := batch
	var removed, failures int64
	for from := prefix; ; {
		rctx, cancel := s.requestContext(ctx)
		idx, err := etcdpage.Read(rctx, s.kv, from, prefixEnd(prefix), 0, int64(page), clientv3.WithKeysOnly())
		cancel()
		if err != nil {
			return removed, mapError(err, false)
		}
		if len(idx.Kvs) == 0 {
			if from == prefix {
				return removed, nil
			}
			from = prefix
			continue
		}
		for at := 0; at < len(idx.Kvs); at += batch {
			keys := make([]authority.Key, 0, batch)
			for _, kv := range idx.Kvs[at:min(at+batch, len(idx.Kvs))] {
				keys = append(keys, authority.Key(strings.TrimPrefix(string(kv.Key), prefix)))
			}
			n, err := s.removeOwnerBatch(ctx, owner, keys, &failures)
			removed += n
			if err != nil {
				return removed, err
			}
		}
		from = string(idx.Kvs[len(idx.Kvs)-1].Key) + "\x00"
		page = min(2*page, removeIndexPageMax)
	}
}

// removeOwnerBatch removes owner's rows at keys (a batch of its index) in
// one Txn, reading them again while a row changes between the read and the
// Txn; failures counts those conflicts over the whole removal.
func (s *Store) removeOwnerBatch(ctx context.Context, owner authority.OwnerToken, keys []authority.Key, failures *int64) (int64, error) {
	for ; *failures < maxAttempts; *failures++ {
		gets := make([]clientv3.Op, len(keys))
		for i, key := range keys {
			gets[i] = opGet(s.keys.row(key))
		}
		got, err := s.readInParts(ctx, gets)
		if err != nil {
			return 0, err
		}
		t, n, err := s.buildOwnerRemoval(owner, keys, got)
		if err != nil {
			return 0, err
		}
		resp, err := s.sendWrite(ctx, t, "removing an owner's rows")
		if errors.Is(err, rpctypes.ErrNoSpace) && len(t.touches) > 0 {
			resp, err = s.sendWrite(ctx, deletesOnly(t), "removing an owner's rows")
		}
		if err != nil {
			return 0, err
		}
		if resp.Succeeded {
			return n, nil
		}
		// a row changed between the read and the Txn: read again
	}
	return 0, authority.Wrap(authority.ErrUnavailable, "removeAllByOwner gave up after repeated contention", errContention)
}

// buildOwnerRemoval builds the Txn that removes owner's rows at keys, as
// read in got: each row, its capacity entry and its owner index entry,
// fenced by the row's ModRevision (a stale index entry is dropped, fenced
// the same way). n is how many rows it removes.
func (s *Store) buildOwnerRemoval(owner authority.OwnerToken, keys []authority.Key, got keyedReads) (t *txn, n int64, err error) {
	t = &txn{}
	for _, key := range keys {
		r, err := s.rowIn(got, key)
		if err != nil {
			return nil, 0, err
		}
		rowKey := s.keys.row(key)
		if r == nil || r.owner != owner {
			// a stale index entry (cannot happen through this store)
			var rev int64
			if r != nil {
				rev = r.modRev
			}
			t.cmp(modRevIs(rowKey, rev))
			t.del(s.keys.ownerRow(owner, key))
			continue
		}
		t.cmp(modRevIs(rowKey, r.modRev))
		t.del(rowKey)
		t.del(s.keys.capacityRow(r.alloc, key))
		s.touchCapacity(t, r.alloc)
		t.del(s.keys.ownerRow(owner, key))
		n++
	}
	return t, n, nil
}

// readInParts reads the single-key gets and returns what they read, by key:
// in one Txn, or, when the rows add up to more than the client's receive
// limit, in halves, down to one row a read (only a single row over the limit
// is ErrLimitExceeded). The parts need not share a revision: every row read
// is then fenced by its own ModRevision.
func (s *Store) readInParts(ctx context.Context, gets []clientv3.Op) (keyedReads, error) {
	resp, err := s.read(ctx, gets...)
	if err == nil {
		return readsOf(resp), nil
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
func deletesOnly(t *txn) *txn {
	c := t.clone()
	c.touches = nil
	return c
}
