package etcd

import (
	"context"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/internal/observe"
	"github.com/zlink-systems/authority/provider/etcd/internal/txnkit"
	"github.com/zlink-systems/authority/provider/etcd/schema"
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
		if r == nil || r.Version() != expected {
			// decided without a Txn: counted as the refused Txn would be
			s.obs.Refused(ctx, observe.CompareRowVersion)
			return s.conflict(r), nil
		}
		cur = r
	}
	if cur.Alloc.State != authority.AllocationActive {
		return s.conflictNow(ctx, key)
	}
	rowKey := s.keys.Row(key)
	t := &txnkit.Txn{}
	t.Cmp(modRevIs(rowKey, cur.ModRev))
	t.OrGet(rowKey)
	s.lockFree(t, key)
	next := cur.Next(0)
	var retired []retiredCommit
	switch m.Kind {
	case authority.MutationDelete:
		t.Cmp(s.rowOwnerLive(cur))
		t.Del(rowKey)
		s.unplace(t, cur)
		if r, ok := s.retireCommit(cur); ok {
			retired = append(retired, r)
		}
	case authority.MutationRebindOwnerLease:
		if m.ExpectedOwner != cur.Owner {
			return s.conflictNow(ctx, key)
		}
		next = s.moved(t, cur, m.TargetOwner, cur.Alloc.Descriptor, cur.Alloc.DescriptorLifecycleGeneration)
		next.Token = 0 // a new owner lease: resolved to this write's revision
		next.Payload = m.Payload
		t.Cmp(s.liveCmp(cur.Alloc.Descriptor, cur.Alloc.DescriptorLifecycleGeneration, m.TargetOwner))
		t.Put(rowKey, s.rowValue(t, next))
		s.replace(t, cur, next)
	case authority.MutationRestore:
		if m.ExpectedOwner != cur.Owner {
			return s.conflictNow(ctx, key)
		}
		next.Payload = m.Payload
		t.Put(rowKey, s.rowValue(t, next))
	default: // put
		t.Cmp(s.rowOwnerLive(cur))
		next.Payload = m.Payload
		s.pretendWrite(t, cur, next)
		t.Put(rowKey, s.rowValue(t, next))
	}
	resp, err := s.sendRetiring(ctx, t, retired, "the compare-exchange")
	if err != nil {
		return authority.CompareExchangeResult{}, err
	}
	if !resp.Succeeded {
		r, err := s.rowIn(txnkit.ReadsOf(resp), key)
		if err != nil {
			return authority.CompareExchangeResult{}, err
		}
		return s.conflict(r), nil
	}
	now := s.clock.Now()
	if m.Kind == authority.MutationDelete {
		return authority.CompareExchangeResult{Kind: authority.KindDeleted, StoreVersion: schema.Version(resp.Header.Revision), StoreNow: now}, nil
	}
	next.Written(resp.Header.Revision)
	next.Payload = append([]byte(nil), m.Payload...)
	s.remember(next)
	return authority.CompareExchangeResult{Kind: authority.KindStored, Snapshot: next.Snapshot(now), StoreNow: now}, nil
}

func (s *Store) conflict(r *schema.Row) authority.CompareExchangeResult {
	return authority.CompareExchangeResult{Kind: authority.KindConflict, Current: s.readResult(r)}
}

// conflictNow answers a conflict decided without a Txn (the row is not in the
// expected state or owner), counted as a refused row version compare.
func (s *Store) conflictNow(ctx context.Context, key authority.Key) (authority.CompareExchangeResult, error) {
	s.obs.Refused(ctx, observe.CompareRowVersion)
	r, err := s.loadRow(ctx, key)
	if err != nil {
		return authority.CompareExchangeResult{}, err
	}
	return s.conflict(r), nil
}
