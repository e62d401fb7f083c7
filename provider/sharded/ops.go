package sharded

import (
	"context"

	authority "github.com/zlink-systems/authority"
)

// The contract's single-row operations: each goes to its row's shard, where
// it is one Txn in one cluster with the etcd store's fencing (row version,
// owner liveness, reservation, record), unchanged. Over several shards the
// row numbers are translated (rowversion.go), a read resolves the row lock
// of a committed cross-shard aggregate first, and a write of an existing row
// that meets a row lock resolves it and writes again (twophase.Coordinator:
// ReadAuthority, Retry). A reserved or absent row is never locked, so
// Reserve, Commit, CompleteCreation and Abort need no retry.

// ReadAuthority returns the row at key (KindSnapshot) or KindMissing. Over
// several shards a row locked by a committed cross-shard aggregate is
// applied first (in every shard of the aggregate); a read-only store, which
// writes nothing, answers the row as its shard holds it.
func (s *Store) ReadAuthority(ctx context.Context, key authority.Key) (authority.ReadResult, error) {
	if err := s.begin(ctx); err != nil {
		return authority.ReadResult{}, err
	}
	sh := s.forKey(key)
	var res authority.ReadResult
	var err error
	if s.coord != nil && !s.cfg.ReadOnly {
		res, err = s.coord.ReadAuthority(ctx, key)
	} else {
		res, err = sh.store.ReadAuthority(ctx, key)
	}
	if err == nil {
		res, err = s.num.read(sh.index, res)
	}
	return res, inShard(sh.index, err)
}

// CompareExchangeAuthority applies m to the active row at key when its
// version is expected.
func (s *Store) CompareExchangeAuthority(ctx context.Context, key authority.Key, expected authority.StoreVersion, m authority.Mutation) (authority.CompareExchangeResult, error) {
	if err := s.begin(ctx); err != nil {
		return authority.CompareExchangeResult{}, err
	}
	sh := s.forKey(key)
	raw := s.num.shardVersion(sh.index, expected)
	var res authority.CompareExchangeResult
	err := s.retry(ctx, func(ctx context.Context) (err error) {
		res, err = sh.store.CompareExchangeAuthority(ctx, key, raw, m)
		return err
	})
	if err == nil {
		res, err = s.num.cas(sh.index, res)
	}
	return res, inShard(sh.index, err)
}

// retry runs op, a write of existing rows in one shard, resolving the row
// locks it meets (twophase.Coordinator.Retry); over one shard it runs op
// once.
func (s *Store) retry(ctx context.Context, op func(ctx context.Context) error) error {
	if s.coord == nil {
		return op(ctx)
	}
	return s.coord.Retry(ctx, op)
}

// Reserve creates a reserved row for a new object in its key's shard.
func (s *Store) Reserve(ctx context.Context, req authority.ReserveRequest) (authority.ReserveResult, error) {
	if err := s.begin(ctx); err != nil {
		return authority.ReserveResult{}, err
	}
	sh := s.forObject(req.Key)
	res, err := sh.store.Reserve(ctx, req)
	if err == nil {
		res, err = s.num.reserve(sh.index, res)
	}
	return res, inShard(sh.index, err)
}

// Commit turns a reserved Spot into an active one.
func (s *Store) Commit(ctx context.Context, req authority.CommitRequest) (authority.CommitResult, error) {
	if err := s.begin(ctx); err != nil {
		return authority.CommitResult{}, err
	}
	sh := s.forObject(req.Key)
	req.ExpectedStoreVersion = s.num.shardVersion(sh.index, req.ExpectedStoreVersion)
	res, err := sh.store.Commit(ctx, req)
	if err == nil {
		res, err = s.num.commit(sh.index, res)
	}
	return res, inShard(sh.index, err)
}

// CompleteCreation finishes a reserved Actor and publishes its creation
// terminal in the row's shard.
func (s *Store) CompleteCreation(ctx context.Context, req authority.CompleteCreationRequest) (authority.CompleteCreationResult, error) {
	if err := s.begin(ctx); err != nil {
		return authority.CompleteCreationResult{}, err
	}
	sh := s.forObject(req.Key)
	req.ExpectedStoreVersion = s.num.shardVersion(sh.index, req.ExpectedStoreVersion)
	res, err := sh.store.CompleteCreation(ctx, req)
	if err == nil {
		res, err = s.num.completion(sh.index, res)
	}
	return res, inShard(sh.index, err)
}

// Abort deletes a reserved row and releases its capacity.
func (s *Store) Abort(ctx context.Context, req authority.AbortRequest) (authority.AbortResult, error) {
	if err := s.begin(ctx); err != nil {
		return authority.AbortResult{}, err
	}
	sh := s.forObject(req.Key)
	req.ExpectedStoreVersion = s.num.shardVersion(sh.index, req.ExpectedStoreVersion)
	res, err := sh.store.Abort(ctx, req)
	return res, inShard(sh.index, err)
}

// WaitForChange returns once the row at key is no longer at version seen
// (authority.ChangeWaiter), watching the row's shard.
func (s *Store) WaitForChange(ctx context.Context, key authority.Key, seen authority.StoreVersion) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	sh := s.forKey(key)
	return inShard(sh.index, sh.store.WaitForChange(ctx, key, s.num.shardVersion(sh.index, seen)))
}

// ReadCreationTerminal returns the unexpired terminal of an operation. The
// terminal lives in the shard of the row that completed, which the
// operation does not name: every shard is read, in parallel, and the
// terminal found is returned (KindMissing when none holds it). Should two
// shards hold one (the operation completed two rows of different shards,
// which one store would have refused as alreadyCompleted), the lowest
// shard's is returned (docs/deviations.md D4).
func (s *Store) ReadCreationTerminal(ctx context.Context, op authority.CreationOperation) (authority.TerminalReadResult, error) {
	if err := s.begin(ctx); err != nil {
		return authority.TerminalReadResult{}, err
	}
	if len(s.shards) == 1 {
		res, err := s.shards[0].store.ReadCreationTerminal(ctx, op)
		return res, inShard(0, err)
	}
	if err := authority.ValidateCreationOperation(op); err != nil {
		return authority.TerminalReadResult{}, err
	}
	results := make([]authority.TerminalReadResult, len(s.shards))
	err := s.eachShard(ctx, func(ctx context.Context, i int, sh *shard) (err error) {
		results[i], err = sh.store.ReadCreationTerminal(ctx, op)
		return err
	})
	if err != nil {
		return authority.TerminalReadResult{}, err
	}
	for _, r := range results {
		if r.Kind == authority.KindFound {
			return r, nil
		}
	}
	return results[0], nil
}
