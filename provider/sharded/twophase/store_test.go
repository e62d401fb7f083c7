package twophase_test

import (
	"context"
	"slices"
	"strings"

	authority "github.com/zlink-systems/authority"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
)

// testStore is the smallest sharded authority.Store the conformance
// aggregate tests run on: each row operation in its key's shard (writes
// through the coordinator's Retry, reads through its ReadAuthority),
// aggregates through the coordinator, listings and capacity merged over
// the shards. It is a test harness, not package provider/sharded: its
// listing reads every shard whole.
type testStore struct{ in *instance }

var _ authority.Store = testStore{}

func (s testStore) ReadAuthority(ctx context.Context, key authority.Key) (authority.ReadResult, error) {
	return s.in.coord.ReadAuthority(ctx, key)
}

func (s testStore) CompareExchangeAuthority(ctx context.Context, key authority.Key, expected authority.StoreVersion, m authority.Mutation) (res authority.CompareExchangeResult, err error) {
	err = s.in.coord.Retry(ctx, func(ctx context.Context) error {
		res, err = s.in.storeOf(key).CompareExchangeAuthority(ctx, key, expected, m)
		return err
	})
	return res, err
}

func (s testStore) ListAuthorities(ctx context.Context, prefix string, cursor authority.ScanCursor, limit int) (authority.ScanResult, error) {
	if err := authority.ValidateScanLimit(limit); err != nil {
		return authority.ScanResult{}, err
	}
	var all []authority.ScanItem
	for _, st := range s.in.stores {
		var c authority.ScanCursor
		for {
			page, err := st.ListAuthorities(ctx, prefix, c, authority.MaxScanLimit)
			if err != nil {
				return authority.ScanResult{}, err
			}
			all = append(all, page.Items...)
			if c = page.NextCursor; c == "" {
				break
			}
		}
	}
	slices.SortFunc(all, func(a, b authority.ScanItem) int { return strings.Compare(string(a.Key), string(b.Key)) })
	if cursor != "" {
		all = slices.DeleteFunc(all, func(it authority.ScanItem) bool { return string(it.Key) <= string(cursor) })
	}
	res := authority.ScanResult{Kind: authority.KindPage, Items: all[:min(limit, len(all))]}
	if len(all) > limit {
		res.NextCursor = authority.ScanCursor(res.Items[limit-1].Key)
	}
	return res, nil
}

func (s testStore) RemoveAllByOwner(ctx context.Context, owner authority.OwnerToken) (int64, error) {
	var total int64
	for _, st := range s.in.stores {
		err := s.in.coord.Retry(ctx, func(ctx context.Context) error {
			n, err := st.RemoveAllByOwner(ctx, owner)
			total += n
			return err
		})
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

func (s testStore) of(k authority.ObjectKey) (*etcdstore.Store, error) {
	key, err := k.Encode()
	if err != nil {
		return nil, authority.Invalid(err.Error())
	}
	return s.in.storeOf(key), nil
}

func (s testStore) Reserve(ctx context.Context, req authority.ReserveRequest) (authority.ReserveResult, error) {
	st, err := s.of(req.Key)
	if err != nil {
		return authority.ReserveResult{}, err
	}
	return st.Reserve(ctx, req)
}

func (s testStore) Commit(ctx context.Context, req authority.CommitRequest) (authority.CommitResult, error) {
	st, err := s.of(req.Key)
	if err != nil {
		return authority.CommitResult{}, err
	}
	return st.Commit(ctx, req)
}

func (s testStore) CompleteCreation(ctx context.Context, req authority.CompleteCreationRequest) (authority.CompleteCreationResult, error) {
	st, err := s.of(req.Key)
	if err != nil {
		return authority.CompleteCreationResult{}, err
	}
	return st.CompleteCreation(ctx, req)
}

func (s testStore) ReadCreationTerminal(ctx context.Context, op authority.CreationOperation) (res authority.TerminalReadResult, err error) {
	for _, st := range s.in.stores {
		if res, err = st.ReadCreationTerminal(ctx, op); err != nil || res.Kind != authority.KindMissing {
			return res, err
		}
	}
	return res, nil
}

func (s testStore) Abort(ctx context.Context, req authority.AbortRequest) (authority.AbortResult, error) {
	st, err := s.of(req.Key)
	if err != nil {
		return authority.AbortResult{}, err
	}
	return st.Abort(ctx, req)
}

func (s testStore) PrepareAggregate(ctx context.Context, req authority.AggregatePrepareRequest) (authority.PrepareAggregateResult, error) {
	return s.in.coord.PrepareAggregate(ctx, req)
}

func (s testStore) CommitAggregate(ctx context.Context, fence authority.Fence) (authority.CommitAggregateResult, error) {
	return s.in.coord.CommitAggregate(ctx, fence)
}

func (s testStore) AbortAggregate(ctx context.Context, fence authority.Fence) (authority.AbortAggregateResult, error) {
	return s.in.coord.AbortAggregate(ctx, fence)
}

func (s testStore) CapacityUsage(ctx context.Context, node authority.NodeDescriptor, lifecycle int64, kind authority.ObjectKind, stableType string) (authority.CapacityUsage, error) {
	var sum authority.CapacityUsage
	for _, st := range s.in.stores {
		u, err := st.CapacityUsage(ctx, node, lifecycle, kind, stableType)
		if err != nil {
			return authority.CapacityUsage{}, err
		}
		sum.Active += u.Active
		sum.Reserved += u.Reserved
	}
	return sum, nil
}
