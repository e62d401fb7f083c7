package sharded

import (
	"context"
	"fmt"
	"strings"

	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/storeversion"
)

// Store versions across shards. Each shard's namespace has its own active
// version, as a single cluster's does, and every gate is decided per shard
// (a row is written and fenced in its own shard only). New announces the
// process in every shard (each shard's etcd.New does), so a finalize of any
// shard sees it. Finalize moves every shard: it checks them all first (dry)
// so that a process in the way on any shard is named before a version moves,
// then finalizes them one after another; a shard that failed meanwhile is
// named, and calling Finalize again finishes the others (a version never
// moves back).

// ActiveVersion returns the lowest active version of the shards, as this
// store last saw each.
func (s *Store) ActiveVersion() storeversion.Version {
	v := s.shards[0].store.ActiveVersion()
	for _, sh := range s.shards[1:] {
		v = min(v, sh.store.ActiveVersion())
	}
	return v
}

// UpgradeStatus reads every shard's upgrade status (etcd.Store.UpgradeStatus),
// by shard.
func (s *Store) UpgradeStatus(ctx context.Context) ([]etcdstore.UpgradeStatus, error) {
	out := make([]etcdstore.UpgradeStatus, len(s.shards))
	err := s.eachShard(ctx, func(ctx context.Context, i int, sh *shard) (err error) {
		out[i], err = sh.store.UpgradeStatus(ctx)
		return err
	})
	return out, err
}

// Finalize moves every shard's active version forward to target
// (etcd.Store.Finalize), once every live process of every shard works at
// it, and returns each shard's result. With dryRun it checks every shard
// and writes nothing. A shard whose finalize is blocked stops it with
// etcd.ErrFinalizeBlocked naming the shard; shards finalized before it stay
// finalized.
func (s *Store) Finalize(ctx context.Context, target storeversion.Version, dryRun bool) ([]etcdstore.FinalizeResult, error) {
	out := make([]etcdstore.FinalizeResult, len(s.shards))
	err := s.eachShard(ctx, func(ctx context.Context, i int, sh *shard) (err error) {
		out[i], err = sh.store.Finalize(ctx, target, true)
		return err
	})
	if err != nil || dryRun {
		return out, err
	}
	for i, sh := range s.shards {
		res, err := sh.store.Finalize(ctx, target, false)
		out[i] = res
		if err != nil {
			return out, inShard(i, err)
		}
	}
	return out, nil
}

// ServerWarning returns the shards' server warnings (etcd.Store.ServerWarning),
// each naming its shard; "" when none has one.
func (s *Store) ServerWarning() string {
	var w []string
	for i, sh := range s.shards {
		if msg := sh.store.ServerWarning(); msg != "" {
			w = append(w, fmt.Sprintf("shard %d: %s", i, msg))
		}
	}
	return strings.Join(w, "; ")
}
