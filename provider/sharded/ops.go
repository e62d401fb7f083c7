package sharded

import (
	"context"
	"errors"

	authority "github.com/zlink-systems/authority"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
)

// The contract's single-row operations: each goes to its row's shard under
// the map in force (topology.go), where it is one Txn in one cluster with
// the etcd store's fencing (row version, owner liveness, reservation,
// record, and the shard map's revision), unchanged. Over several shards the
// row numbers are translated (rowversion.go), a read resolves the row lock
// of a committed cross-shard aggregate first, and a write of an existing row
// that meets a row lock resolves it and writes again (twophase.Coordinator:
// ReadAuthority, Retry). A reserved or absent row is never locked, so
// Reserve, Commit, CompleteCreation and Abort need no retry.

// ReadAuthority returns the row at key (KindSnapshot) or KindMissing. Over
// several shards a row locked by a committed cross-shard aggregate is
// applied first (in every shard of the aggregate); a read-only store, which
// writes nothing, answers the row as its shard holds it.
func (s *Store) ReadAuthority(ctx context.Context, key authority.Key) (res authority.ReadResult, err error) {
	if err := s.begin(ctx); err != nil {
		return authority.ReadResult{}, err
	}
	err = s.onRowAt(ctx, key, false, func(ctx context.Context, t *topology, sh *shard) (err error) {
		if t.coord != nil && !s.cfg.ReadOnly {
			res, err = t.coord.ReadAuthority(ctx, key)
		} else {
			res, err = sh.store.ReadAuthority(ctx, key)
		}
		if err == nil {
			res, err = t.num.read(sh.index, res)
		}
		return err
	})
	return res, err
}

// CompareExchangeAuthority applies m to the active row at key when its
// version is expected.
func (s *Store) CompareExchangeAuthority(ctx context.Context, key authority.Key, expected authority.StoreVersion, m authority.Mutation) (res authority.CompareExchangeResult, err error) {
	if err := s.begin(ctx); err != nil {
		return authority.CompareExchangeResult{}, err
	}
	err = s.onRowAt(ctx, key, true, func(ctx context.Context, t *topology, sh *shard) error {
		raw := t.num.shardVersion(sh.index, expected)
		err := t.retry(ctx, func(ctx context.Context) (err error) {
			res, err = sh.store.CompareExchangeAuthority(ctx, key, raw, m)
			return err
		})
		if err == nil {
			res, err = t.num.cas(sh.index, res)
		}
		return err
	})
	return res, err
}

// retry runs op, a write of existing rows in one shard of t, resolving the
// row locks it meets (twophase.Coordinator.Retry); over one shard it runs
// op once.
func (t *topology) retry(ctx context.Context, op func(ctx context.Context) error) error {
	if t.coord == nil {
		return op(ctx)
	}
	return t.coord.Retry(ctx, op)
}

// Reserve creates a reserved row for a new object in its key's shard.
func (s *Store) Reserve(ctx context.Context, req authority.ReserveRequest) (res authority.ReserveResult, err error) {
	if err := s.begin(ctx); err != nil {
		return authority.ReserveResult{}, err
	}
	err = s.onObjectAt(ctx, req.Key, func(ctx context.Context, t *topology, sh *shard) (err error) {
		if res, err = sh.store.Reserve(ctx, req); err == nil {
			res, err = t.num.reserve(sh.index, res)
		}
		return err
	})
	return res, err
}

// Commit turns a reserved Spot into an active one.
func (s *Store) Commit(ctx context.Context, req authority.CommitRequest) (res authority.CommitResult, err error) {
	if err := s.begin(ctx); err != nil {
		return authority.CommitResult{}, err
	}
	err = s.onObjectAt(ctx, req.Key, func(ctx context.Context, t *topology, sh *shard) (err error) {
		r := req
		r.ExpectedStoreVersion = t.num.shardVersion(sh.index, req.ExpectedStoreVersion)
		if res, err = sh.store.Commit(ctx, r); err == nil {
			res, err = t.num.commit(sh.index, res)
		}
		return err
	})
	return res, err
}

// CompleteCreation finishes a reserved Actor and publishes its creation
// terminal in the row's shard.
func (s *Store) CompleteCreation(ctx context.Context, req authority.CompleteCreationRequest) (res authority.CompleteCreationResult, err error) {
	if err := s.begin(ctx); err != nil {
		return authority.CompleteCreationResult{}, err
	}
	err = s.onObjectAt(ctx, req.Key, func(ctx context.Context, t *topology, sh *shard) (err error) {
		r := req
		r.ExpectedStoreVersion = t.num.shardVersion(sh.index, req.ExpectedStoreVersion)
		if res, err = sh.store.CompleteCreation(ctx, r); err == nil {
			res, err = t.num.completion(sh.index, res)
		}
		return err
	})
	return res, err
}

// Abort deletes a reserved row and releases its capacity.
func (s *Store) Abort(ctx context.Context, req authority.AbortRequest) (res authority.AbortResult, err error) {
	if err := s.begin(ctx); err != nil {
		return authority.AbortResult{}, err
	}
	err = s.onObjectAt(ctx, req.Key, func(ctx context.Context, t *topology, sh *shard) (err error) {
		r := req
		r.ExpectedStoreVersion = t.num.shardVersion(sh.index, req.ExpectedStoreVersion)
		res, err = sh.store.Abort(ctx, r)
		return err
	})
	return res, err
}

// WaitForChange returns once the row at key is no longer at version seen
// (authority.ChangeWaiter), watching the row's shard. A row that moves to
// another shard changes when the resharding deletes it from the shard it
// left.
func (s *Store) WaitForChange(ctx context.Context, key authority.Key, seen authority.StoreVersion) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	t := s.topo.Load()
	i := t.shardOf(key)
	return inShard(i, t.shards[i].store.WaitForChange(ctx, key, t.num.shardVersion(i, seen)))
}

// ReadCreationTerminal returns the unexpired terminal of an operation. The
// terminal lives in the shard of the row that completed, which the
// operation does not name: every shard is read, in parallel, and the
// terminal found is returned (KindMissing when none holds it). Should two
// shards hold one (the operation completed two rows of different shards,
// which one store would have refused as alreadyCompleted; or a resharding
// copied it), the lowest shard's is returned (docs/deviations.md D4).
func (s *Store) ReadCreationTerminal(ctx context.Context, op authority.CreationOperation) (authority.TerminalReadResult, error) {
	if err := s.begin(ctx); err != nil {
		return authority.TerminalReadResult{}, err
	}
	t := s.topo.Load()
	if len(t.shards) == 1 {
		res, err := t.shards[0].store.ReadCreationTerminal(ctx, op)
		return res, inShard(0, err)
	}
	if err := authority.ValidateCreationOperation(op); err != nil {
		return authority.TerminalReadResult{}, err
	}
	results := make([]authority.TerminalReadResult, len(t.shards))
	err := s.eachShard(ctx, t, func(ctx context.Context, i int, sh *shard) (err error) {
		results[i], err = sh.store.ReadCreationTerminal(ctx, op)
		return err
	})
	if err == nil {
		err = t.checkSwitched(ctx)
	}
	if errors.Is(err, etcdstore.ErrShardMapChanged) {
		if err := s.refresh(ctx, t); err != nil {
			return authority.TerminalReadResult{}, err
		}
		return s.ReadCreationTerminal(ctx, op)
	}
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
