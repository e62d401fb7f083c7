package etcd

import (
	"bytes"
	"context"
	"time"

	"github.com/google/uuid"
	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/provider/etcd/internal/txnkit"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// RelocationStore is the store's relocation blob store: blobs (≤ 1 MiB) under
// ns/blobs/, expiring through the store's bucketed leases and checked against
// the store's clock on read.
type RelocationStore struct{ s *Store }

var _ authority.RelocationStore = RelocationStore{}

// Relocation returns the store's relocation blob store.
func (s *Store) Relocation() RelocationStore { return RelocationStore{s} }

// putNew stores data under a new reference that expires after retention.
func (r RelocationStore) putNew(ctx context.Context, data []byte, retention time.Duration) (authority.BlobReceipt, error) {
	if err := authority.ValidateBlobPut(data, retention); err != nil {
		return authority.BlobReceipt{}, err
	}
	if err := r.s.begin(ctx); err != nil {
		return authority.BlobReceipt{}, err
	}
	now := r.s.clock.Now()
	expires := now.Add(retention)
	value := schema.EncodeBlob(expires, data)
	// A reference is a random UUID put only if its key is absent; should it
	// ever be taken, a fresh one is drawn (a failed compare wrote nothing).
	for range blobReferenceDraws {
		ref := authority.BlobReference(newBlobReference())
		stored := false
		err := r.s.leases.withLeases(ctx, []time.Duration{retention}, func(ids []clientv3.LeaseID) error {
			t := &txnkit.Txn{}
			key := r.s.keys.Blob(string(ref))
			t.Cmp(modRevIs(key, 0))
			t.Put(key, value, clientv3.WithLease(ids[0]))
			resp, err := r.s.sendWrite(ctx, t, "the relocation blob")
			stored = err == nil && resp.Succeeded
			return err
		})
		if err != nil {
			return authority.BlobReceipt{}, err
		}
		if stored {
			return authority.BlobReceipt{Reference: ref, ExpiresAt: expires, StoreNow: now}, nil
		}
	}
	return authority.BlobReceipt{}, authority.Wrap(authority.ErrUnavailable,
		"Relocation blob references collided on every draw", nil)
}

// blobReferenceDraws is how many references PutNew draws before it gives up.
const blobReferenceDraws = 3

// newBlobReference draws a relocation blob reference (replaced in tests).
var newBlobReference = uuid.NewString

// read returns the blob (KindFound) or KindMissing once deleted or expired.
func (r RelocationStore) read(ctx context.Context, ref authority.BlobReference) (authority.BlobReadResult, error) {
	if err := authority.RequireText(string(ref), "relocation blob reference"); err != nil {
		return authority.BlobReadResult{}, err
	}
	if err := r.s.begin(ctx); err != nil {
		return authority.BlobReadResult{}, err
	}
	if _, err := uuid.Parse(string(ref)); err != nil {
		return authority.BlobReadResult{Kind: authority.KindMissing}, nil
	}
	blobKey := r.s.keys.Blob(string(ref))
	resp, err := r.s.read(ctx, opGet(blobKey))
	if err != nil {
		return authority.BlobReadResult{}, err
	}
	kv := txnkit.ReadsOf(resp)[blobKey]
	if kv == nil {
		return authority.BlobReadResult{Kind: authority.KindMissing}, nil
	}
	expires, data, err := schema.DecodeBlob(kv)
	if err != nil {
		return authority.BlobReadResult{}, err
	}
	if !expires.After(r.s.clock.Now()) {
		// seen expired: gone for every store, whatever their clocks do
		if err := r.s.dropExpired(ctx, blobKey, kv.ModRevision); err != nil {
			return authority.BlobReadResult{}, err
		}
		return authority.BlobReadResult{Kind: authority.KindMissing}, nil
	}
	return authority.BlobReadResult{Kind: authority.KindFound, Bytes: bytes.Clone(data)}, nil
}

// remove removes the blob; deleting a missing blob is not an error.
func (r RelocationStore) remove(ctx context.Context, ref authority.BlobReference) error {
	if err := authority.RequireText(string(ref), "relocation blob reference"); err != nil {
		return err
	}
	if err := r.s.begin(ctx); err != nil {
		return err
	}
	if _, err := uuid.Parse(string(ref)); err != nil {
		return nil
	}
	rctx, cancel := r.s.requestContext(ctx)
	defer cancel()
	if _, err := r.s.kv.Delete(rctx, r.s.keys.Blob(string(ref))); err != nil {
		return mapError(err, true)
	}
	return nil
}
