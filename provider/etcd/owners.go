package etcd

import (
	"context"
	"fmt"
	"time"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/provider/etcd/internal/txnkit"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// liveCmp is the isTargetLive fence: the owner's liveness key for that node
// lifecycle exists. Put in a write's Txn, it keeps a zombie owner (lease
// expired or revoked, key gone) from writing.
func (s *Store) liveCmp(node authority.NodeDescriptor, lifecycle int64, owner authority.OwnerToken) clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(s.keys.Liveness(node, lifecycle, owner)), ">", 0)
}

// rowOwnerLive is the fence that the owner of r is live on r's node.
func (s *Store) rowOwnerLive(r *schema.Row) clientv3.Cmp {
	return s.liveCmp(r.Alloc.Descriptor, r.Alloc.DescriptorLifecycleGeneration, r.Owner)
}

// MarkLive makes owner live on node at lifecycle for ttl: it grants a lease
// of ttl (no keep-alive) and writes the liveness key on it. It is the
// low-level form of Registry.Acquire, for tests and tools that pick their own
// tokens. Marking an already live owner again replaces its lease.
func (s *Store) MarkLive(ctx context.Context, node authority.NodeDescriptor, lifecycle int64, owner authority.OwnerToken, ttl time.Duration) error {
	if err := validateOwnerLease(node, owner.OwnerID, ttl); err != nil {
		return err
	}
	if err := s.begin(ctx); err != nil {
		return err
	}
	if err := s.refuseWrite(); err != nil {
		return err
	}
	rctx, cancel := s.requestContext(ctx)
	defer cancel()
	lease, err := s.client.Grant(rctx, int64(max(ttl, time.Second)/time.Second))
	if err != nil {
		return mapError(err, false)
	}
	key := s.keys.Liveness(node, lifecycle, owner)
	if err := s.putLiveness(rctx, key, node, lifecycle, owner, lease.ID); err != nil {
		s.revokeDetached(ctx, lease.ID)
		return err
	}
	s.mu.Lock()
	prev, had := s.marks[key]
	s.marks[key] = lease.ID
	s.mu.Unlock()
	if had {
		_, _ = s.client.Revoke(rctx, prev)
	}
	return nil
}

func (s *Store) putLiveness(ctx context.Context, key string, node authority.NodeDescriptor, lifecycle int64, owner authority.OwnerToken, lease clientv3.LeaseID) error {
	v := schema.Liveness{MeshName: node.MeshName, RID: node.RID, Lifecycle: lifecycle, OwnerID: owner.OwnerID, Lease: owner.LeaseGeneration}
	t := &txnkit.Txn{}
	t.Put(key, v.Encode(), clientv3.WithLease(lease))
	s.announceOwnerLease(t, lease)
	if _, err := s.kv.Txn(ctx).Then(t.ThenOps()...).Commit(); err != nil {
		return mapError(err, true)
	}
	return nil
}

// MarkDead makes owner not live on node at lifecycle: it deletes the liveness
// key and revokes the lease MarkLive granted for it, if any.
func (s *Store) MarkDead(ctx context.Context, node authority.NodeDescriptor, lifecycle int64, owner authority.OwnerToken) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	if err := s.refuseWrite(); err != nil {
		return err
	}
	key := s.keys.Liveness(node, lifecycle, owner)
	rctx, cancel := s.requestContext(ctx)
	defer cancel()
	if _, err := s.kv.Delete(rctx, key); err != nil {
		return mapError(err, true)
	}
	s.mu.Lock()
	id, had := s.marks[key]
	delete(s.marks, key)
	s.mu.Unlock()
	if had {
		_, _ = s.client.Revoke(rctx, id)
	}
	return nil
}

// IsTargetLive reports whether owner's liveness key for node at lifecycle
// exists (a read; writes fence on the key inside their Txn instead).
func (s *Store) IsTargetLive(ctx context.Context, node authority.NodeDescriptor, lifecycle int64, owner authority.OwnerToken) (bool, error) {
	rctx, cancel := s.requestContext(ctx)
	defer cancel()
	resp, err := s.kv.Get(rctx, s.keys.Liveness(node, lifecycle, owner), clientv3.WithCountOnly())
	if err != nil {
		return false, mapError(err, false)
	}
	return resp.Count > 0, nil
}

// maxOwnerLeaseTTL is the longest lease etcd grants (its lease.MaxLeaseTTL,
// 9e9 seconds); a longer TTL is refused by the server with an error that
// wraps no sentinel, so it is refused here before anything is sent.
const maxOwnerLeaseTTL = 9_000_000_000 * time.Second

// validateOwnerLease checks what an owner lease stores in its keys and asks
// of etcd: the node and owner are text the layout can escape and decode
// again, and the TTL is one etcd grants.
func validateOwnerLease(node authority.NodeDescriptor, ownerID string, ttl time.Duration) error {
	if err := authority.RequireText(node.MeshName, "owner lease mesh name"); err != nil {
		return err
	}
	if err := authority.RequireText(node.RID, "owner lease node RID"); err != nil {
		return err
	}
	if err := authority.RequireText(ownerID, "owner ID"); err != nil {
		return err
	}
	if ttl <= 0 || ttl > maxOwnerLeaseTTL {
		return authority.Invalid(fmt.Sprintf("owner lease TTL must be in (0, %v], not %v.", maxOwnerLeaseTTL, ttl))
	}
	return nil
}
