package etcd

import (
	"context"

	authority "github.com/zlink-systems/authority"
)

// compareExchangeAuthority applies m to the active row at key when its
// version is expected. With the row's state in the cache (it is after any
// read or write of it through this store) it costs one Txn.
func (s *Store) compareExchangeAuthority(ctx context.Context, key authority.Key, expected authority.StoreVersion, m authority.Mutation) (authority.CompareExchangeResult, error) {
	if err := authority.ValidateCompareExchange(key, m); err != nil {
		return authority.CompareExchangeResult{}, err
	}
	if err := s.begin(ctx); err != nil {
		return authority.CompareExchangeResult{}, err
	}
	cur := s.cachedRow(key, expected)
	if cur == nil {
		r, err := s.loadRow(ctx, key)
		if err != nil {
			return authority.CompareExchangeResult{}, err
		}
		if r == nil || version(r.modRev) != expected {
			return s.conflict(r), nil
		}
		cur = r
	}
	if cur.alloc.State != authority.AllocationActive {
		return s.conflictNow(ctx, key)
	}
	rowKey := s.keys.row(key)
	t := &txn{}
	t.cmp(modRevIs(rowKey, cur.modRev))
	t.orGet(rowKey)
	next := cur.next(0)
	switch m.Kind {
	case authority.MutationDelete:
		t.cmp(s.rowOwnerLive(cur))
		t.del(rowKey)
		t.del(s.keys.capacityRow(cur.alloc, key))
		s.touchCapacity(t, cur.alloc)
		t.del(s.keys.ownerRow(cur.owner, key))
	case authority.MutationRebindOwnerLease:
		if m.ExpectedOwner != cur.owner {
			return s.conflictNow(ctx, key)
		}
		next.owner = m.TargetOwner
		next.token = 0 // a new owner lease: resolved to this write's revision
		next.payload = m.Payload
		t.cmp(s.liveCmp(cur.alloc.Descriptor, cur.alloc.DescriptorLifecycleGeneration, m.TargetOwner))
		t.put(rowKey, next.encode())
		t.del(s.keys.ownerRow(cur.owner, key))
		t.put(s.keys.ownerRow(next.owner, key), "")
	case authority.MutationRestore:
		if m.ExpectedOwner != cur.owner {
			return s.conflictNow(ctx, key)
		}
		next.payload = m.Payload
		t.put(rowKey, next.encode())
	default: // put
		t.cmp(s.rowOwnerLive(cur))
		next.payload = m.Payload
		t.put(rowKey, next.encode())
	}
	resp, err := s.sendWrite(ctx, t, "the compare-exchange")
	if err != nil {
		return authority.CompareExchangeResult{}, err
	}
	if !resp.Succeeded {
		r, err := s.rowIn(readsOf(resp), key)
		if err != nil {
			return authority.CompareExchangeResult{}, err
		}
		return s.conflict(r), nil
	}
	now := s.clock.Now()
	if m.Kind == authority.MutationDelete {
		return authority.CompareExchangeResult{Kind: authority.KindDeleted, StoreVersion: version(resp.Header.Revision), StoreNow: now}, nil
	}
	next.written(resp.Header.Revision)
	next.payload = append([]byte(nil), m.Payload...)
	s.remember(next)
	return authority.CompareExchangeResult{Kind: authority.KindStored, Snapshot: next.snapshot(now), StoreNow: now}, nil
}

func (s *Store) conflict(r *row) authority.CompareExchangeResult {
	return authority.CompareExchangeResult{Kind: authority.KindConflict, Current: s.readResult(r)}
}

func (s *Store) conflictNow(ctx context.Context, key authority.Key) (authority.CompareExchangeResult, error) {
	r, err := s.loadRow(ctx, key)
	if err != nil {
		return authority.CompareExchangeResult{}, err
	}
	return s.conflict(r), nil
}
