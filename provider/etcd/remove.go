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
// its capacity entry, its owner index entry, the reservation terminal of a
// row that still answers a retry of its commit (retire.go) and (once per
// node lifecycle) its node's capacity epoch.
const opsPerRemovedRow = 5

// removeAllByOwner deletes every row held by owner with its capacity, in
// Txns that fit --max-txn-ops, each row fenced by its ModRevision: the rows
// placed before storeversion.FewerKeys through the owner index, then those
// with placement keys through each node lifecycle the owner's directory
// names (placement.go). It returns how many rows it removed.
func (s *Store) removeAllByOwner(ctx context.Context, owner authority.OwnerToken) (int64, error) {
	if err := authority.ValidateOwner(owner); err != nil {
		return 0, err
	}
	if err := s.begin(ctx); err != nil {
		return 0, err
	}
	rm := &ownerRemoval{s: s, owner: owner, batch: max(1, s.maxOps/opsPerRemovedRow)}
	if err := rm.walk(ctx, ownerRows{prefix: s.keys.OwnerRowsPrefix(owner)}); err != nil {
		return rm.removed, err
	}
	err := s.eachOwnerNode(ctx, owner, func(node authority.NodeDescriptor, lifecycle int64) error {
		return rm.walk(ctx, ownerRows{prefix: s.keys.PlacementOwnerPrefix(node, lifecycle, owner), placed: true,
			node: node, lifecycle: lifecycle})
	})
	return rm.removed, err
}

// ownerRows is one range that names an owner's rows: its owner index
// (keys whose suffix is the row's key), or its placement keys on one node
// lifecycle (placed: the keys are capacity entries).
type ownerRows struct {
	prefix    string
	placed    bool
	node      authority.NodeDescriptor
	lifecycle int64
}

// ownerRemoval is one RemoveAllByOwner.
type ownerRemoval struct {
	s        *Store
	owner    authority.OwnerToken
	batch    int // rows a Txn
	removed  int64
	failures int
}

// walk removes the rows src names.
func (rm *ownerRemoval) walk(ctx context.Context, src ownerRows) error {
	// from moves past each removed page: etcd walks the tombstones of the
	// deleted index entries in a range until compaction, so reading from
	// the prefix every time would cost each read all the pages before it
	// (quadratic in the owner's rows), and a counted range (a plain ranged
	// Get with a limit) would cost every entry after the page.
	// readOwnerIndex streams each page: it costs its own entries. A pass
	// that reaches the end reads once more from the prefix, for rows added
	// behind it meanwhile (that read walks the pass's tombstones once).
	prefix := src.prefix
	from := prefix
	for {
		keys, more, err := rm.s.readOwnerIndex(ctx, prefix, from)
		if err != nil {
			return err
		}
		if len(keys) == 0 {
			if from == prefix {
				return nil
			}
			from = prefix
			continue
		}
		done, err := rm.removeKeys(ctx, src, keys)
		if err != nil {
			return err
		}
		if from = prefix + string(keys[done-1]) + "\x00"; !more {
			from = prefix
		}
	}
}

// removeKeys removes the owner's rows at keys (one page of src, in order)
// in Txns of batch rows, and returns how many keys it got through. A Txn
// that failed because a row changed between its read and the Txn is tried
// again, re-read, until failures reaches maxAttempts over the whole
// removal.
func (rm *ownerRemoval) removeKeys(ctx context.Context, src ownerRows, keys []authority.Key) (done int, err error) {
	s := rm.s
	for done < len(keys) {
		part := keys[done:min(done+rm.batch, len(keys))]
		gets := make([]clientv3.Op, len(part))
		for i, key := range part {
			gets[i] = opGet(s.keys.Row(key))
		}
		got, err := s.readInParts(ctx, gets)
		if err != nil {
			return done, err
		}
		t, retired, n, err := rm.build(src, part, got)
		if err != nil {
			return done, err
		}
		resp, err := s.sendRetiring(ctx, t, retired, "removing an owner's rows")
		if errors.Is(err, rpctypes.ErrNoSpace) && len(t.Touches) > 0 {
			// over the quota only deletes are taken: without the epoch
			// touches and without the terminals of retired commits (a retry
			// of such a commit is then stale rather than alreadyCommitted)
			resp, err = s.sendWrite(ctx, deletesOnly(t), "removing an owner's rows")
		}
		if err != nil {
			return done, err
		}
		if !resp.Succeeded { // a row changed between the read and the Txn: read again
			if rm.failures++; rm.failures >= maxAttempts {
				return done, authority.Wrap(authority.ErrUnavailable, "removeAllByOwner gave up after repeated contention", errContention)
			}
			continue
		}
		rm.removed += n
		done += len(part)
	}
	return done, nil
}

// build builds the Txn that removes the owner's rows at keys (named by
// src), as read in got: each row and where its capacity is held
// (placement.go), fenced by the row's ModRevision and its row lock's
// absence, and the reservation
// terminal of each row that still answers a retry of its commit (to put
// with it: retired). An entry of src whose row the owner does not hold is
// dropped, fenced the same way (it cannot happen through this store). n is
// how many rows it removes.
func (rm *ownerRemoval) build(src ownerRows, keys []authority.Key, got txnkit.Reads) (t *txnkit.Txn, retired []retiredCommit, n int64, err error) {
	s := rm.s
	t = &txnkit.Txn{}
	for _, key := range keys {
		r, err := s.rowIn(got, key)
		if err != nil {
			return nil, nil, 0, err
		}
		rowKey := s.keys.Row(key)
		if r == nil || r.Owner != rm.owner {
			// a stale entry
			var rev int64
			if r != nil {
				rev = r.ModRev
			}
			t.Cmp(modRevIs(rowKey, rev))
			t.Del(src.prefix + string(key))
			if src.placed {
				t.Touch(s.keys.CapacityEpoch(src.node, src.lifecycle))
			}
			continue
		}
		t.Cmp(modRevIs(rowKey, r.ModRev))
		s.lockFree(t, key)
		t.Del(rowKey)
		s.unplace(t, r)
		if c, ok := s.retireCommit(r); ok {
			retired = append(retired, c)
		}
		n++
	}
	return t, retired, n, nil
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
