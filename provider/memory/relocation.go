package memory

import (
	"bytes"
	"container/heap"
	"context"
	crand "crypto/rand"
	"encoding/base64"
	"sync"
	"time"

	authority "github.com/zlink-systems/authority"
)

// RelocationStore is an in-memory authority.RelocationStore. Blobs are
// copied in and out, expire after their retention on the store's clock, and
// are named by 128-bit random references. Expired blobs are swept on PutNew.
type RelocationStore struct {
	clock authority.Clock

	mu     sync.Mutex
	blobs  map[authority.BlobReference]*blob
	expiry blobHeap
}

type blob struct {
	ref       authority.BlobReference
	data      []byte
	expiresAt time.Time
}

var _ authority.RelocationStore = (*RelocationStore)(nil)

// NewRelocationStore returns an empty relocation store on clock (nil:
// authority.SystemClock).
func NewRelocationStore(clock authority.Clock) *RelocationStore {
	return &RelocationStore{clock: authority.NewMonotonicClock(clock), blobs: make(map[authority.BlobReference]*blob)}
}

// PutNew stores a copy of data under a new reference that expires after
// retention.
func (r *RelocationStore) PutNew(ctx context.Context, data []byte, retention time.Duration) (authority.BlobReceipt, error) {
	if err := authority.ValidateBlobPut(data, retention); err != nil {
		return authority.BlobReceipt{}, err
	}
	if err := ctx.Err(); err != nil {
		return authority.BlobReceipt{}, err
	}
	var id [16]byte
	if _, err := crand.Read(id[:]); err != nil {
		return authority.BlobReceipt{}, authority.Wrap(authority.ErrUnavailable, "Relocation blob reference could not be drawn", err)
	}
	ref := authority.BlobReference("mem-" + base64.RawURLEncoding.EncodeToString(id[:]))
	b := &blob{ref: ref, data: bytes.Clone(data)}
	if b.data == nil {
		b.data = []byte{}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.clock.Now()
	r.sweep(now)
	b.expiresAt = now.Add(retention)
	r.blobs[ref] = b
	heap.Push(&r.expiry, b)
	return authority.BlobReceipt{Reference: ref, ExpiresAt: b.expiresAt, StoreNow: now}, nil
}

// Read returns a copy of the blob (KindFound) or KindMissing once it was
// deleted or expired.
func (r *RelocationStore) Read(ctx context.Context, ref authority.BlobReference) (authority.BlobReadResult, error) {
	if err := authority.RequireText(string(ref), "relocation blob reference"); err != nil {
		return authority.BlobReadResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return authority.BlobReadResult{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.blobs[ref]
	if b == nil {
		return authority.BlobReadResult{Kind: authority.KindMissing}, nil
	}
	if !b.expiresAt.After(r.clock.Now()) {
		r.drop(b)
		return authority.BlobReadResult{Kind: authority.KindMissing}, nil
	}
	return authority.BlobReadResult{Kind: authority.KindFound, Bytes: bytes.Clone(b.data)}, nil
}

// Delete removes the blob; deleting a missing blob is not an error.
func (r *RelocationStore) Delete(ctx context.Context, ref authority.BlobReference) error {
	if err := authority.RequireText(string(ref), "relocation blob reference"); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	r.mu.Lock()
	if b := r.blobs[ref]; b != nil {
		r.drop(b)
	}
	r.mu.Unlock()
	return nil
}

// Len returns how many blobs are stored, expired ones not yet swept included.
func (r *RelocationStore) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.blobs)
}

// drop forgets a blob and releases its bytes; its expiry entry stays in
// the heap until due. The caller holds r.mu.
func (r *RelocationStore) drop(b *blob) {
	delete(r.blobs, b.ref)
	b.data = nil
}

// sweep drops the blobs expired at now. The caller holds r.mu.
func (r *RelocationStore) sweep(now time.Time) {
	for len(r.expiry) > 0 && !r.expiry[0].expiresAt.After(now) {
		b := heap.Pop(&r.expiry).(*blob)
		if r.blobs[b.ref] == b {
			r.drop(b)
		}
	}
}

// blobHeap orders blobs by expiry.
type blobHeap []*blob

func (h blobHeap) Len() int           { return len(h) }
func (h blobHeap) Less(i, j int) bool { return h[i].expiresAt.Before(h[j].expiresAt) }
func (h blobHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *blobHeap) Push(x any)        { *h = append(*h, x.(*blob)) }
func (h *blobHeap) Pop() any {
	old := *h
	n := len(old) - 1
	x := old[n]
	old[n] = nil
	*h = old[:n]
	return x
}
