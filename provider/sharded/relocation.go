package sharded

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	authority "github.com/zlink-systems/authority"
)

// RelocationStore is the store's relocation blob store: each blob in one
// shard, the shards taken in turn. Over several shards a reference is the
// shard's index, ":", and the shard's own reference; over one shard it is
// the shard's reference unchanged (a single-cluster store's blobs stay
// readable, and its reads of this store's blobs).
type RelocationStore struct {
	s    *Store
	next atomic.Uint64
}

var _ authority.RelocationStore = (*RelocationStore)(nil)

// Relocation returns the store's relocation blob store.
func (s *Store) Relocation() *RelocationStore { return &RelocationStore{s: s} }

// PutNew stores data under a new reference that expires after retention.
func (r *RelocationStore) PutNew(ctx context.Context, data []byte, retention time.Duration) (authority.BlobReceipt, error) {
	if err := authority.ValidateBlobPut(data, retention); err != nil {
		return authority.BlobReceipt{}, err
	}
	if err := r.s.begin(ctx); err != nil {
		return authority.BlobReceipt{}, err
	}
	i := int(r.next.Add(1) % uint64(len(r.s.shards)))
	rec, err := r.s.shards[i].store.Relocation().PutNew(ctx, data, retention)
	if err != nil {
		return authority.BlobReceipt{}, inShard(i, err)
	}
	if len(r.s.shards) > 1 {
		rec.Reference = authority.BlobReference(strconv.Itoa(i) + ":" + string(rec.Reference))
	}
	return rec, nil
}

// route returns the shard and the shard's reference of ref (ok false: a
// reference no shard gave out).
func (r *RelocationStore) route(ref authority.BlobReference) (int, authority.BlobReference, bool) {
	if len(r.s.shards) == 1 {
		return 0, ref, true
	}
	index, rest, found := strings.Cut(string(ref), ":")
	i, err := strconv.Atoi(index)
	if !found || err != nil || i < 0 || i >= len(r.s.shards) || strconv.Itoa(i) != index || rest == "" {
		return 0, "", false
	}
	return i, authority.BlobReference(rest), true
}

// Read returns the blob (KindFound) or KindMissing once deleted or expired
// (also for a reference no shard gave out).
func (r *RelocationStore) Read(ctx context.Context, ref authority.BlobReference) (authority.BlobReadResult, error) {
	if err := authority.RequireText(string(ref), "relocation blob reference"); err != nil {
		return authority.BlobReadResult{}, err
	}
	if err := r.s.begin(ctx); err != nil {
		return authority.BlobReadResult{}, err
	}
	i, own, ok := r.route(ref)
	if !ok {
		return authority.BlobReadResult{Kind: authority.KindMissing}, nil
	}
	res, err := r.s.shards[i].store.Relocation().Read(ctx, own)
	return res, inShard(i, err)
}

// Delete removes the blob; deleting a missing blob is not an error.
func (r *RelocationStore) Delete(ctx context.Context, ref authority.BlobReference) error {
	if err := authority.RequireText(string(ref), "relocation blob reference"); err != nil {
		return err
	}
	if err := r.s.begin(ctx); err != nil {
		return err
	}
	i, own, ok := r.route(ref)
	if !ok {
		return nil
	}
	return inShard(i, r.s.shards[i].store.Relocation().Delete(ctx, own))
}
