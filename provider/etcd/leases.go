package etcd

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/singleflight"

	authority "github.com/zlink-systems/authority"
)

const (
	// bucketWidth is the expiry granularity of shared record leases.
	bucketWidth = time.Minute
	// bucketSlack keeps a record a little past its bucket's end.
	bucketSlack = 30 * time.Second
	// maxLeaseTTL caps record leases (etcd refuses TTLs above ~9e9 s); the
	// contract refuses retentions beyond it.
	maxLeaseTTL = authority.MaxRetention
)

// leaseBuckets hands out shared leases for records that expire: one lease per
// bucket of expiry times, granted on demand and reused until it ends, so the
// number of leases stays small however many records are written. Concurrent
// callers needing a bucket's lease share one Grant.
type leaseBuckets struct {
	s  *Store
	mu sync.Mutex
	// by bucket end (wall time, Unix seconds)
	leases   map[int64]clientv3.LeaseID
	granting singleflight.Group
}

func newLeaseBuckets(s *Store) *leaseBuckets {
	return &leaseBuckets{s: s, leases: map[int64]clientv3.LeaseID{}}
}

// lease returns a lease that lives at least remaining from now.
func (b *leaseBuckets) lease(ctx context.Context, remaining time.Duration) (clientv3.LeaseID, error) {
	remaining = min(max(remaining, time.Second), maxLeaseTTL)
	now := time.Now()
	end := now.Add(remaining).Truncate(bucketWidth).Add(bucketWidth)
	bucket := end.Unix()
	b.mu.Lock()
	id, ok := b.leases[bucket]
	// forget buckets that have ended
	for k := range b.leases {
		if k < now.Unix() {
			delete(b.leases, k)
		}
	}
	b.mu.Unlock()
	if ok {
		return id, nil
	}
	ttl := int64((end.Sub(now) + bucketSlack) / time.Second)
	// The Grant serves every caller waiting for the bucket: it runs on a
	// context no single caller's cancellation ends, bounded by the request
	// timeout (or the dial timeout when there is none).
	grant := b.granting.DoChan(strconv.FormatInt(bucket, 10), func() (any, error) {
		gctx, cancel := b.s.detachedContext(ctx)
		defer cancel()
		resp, err := b.s.client.Grant(gctx, ttl)
		if err != nil {
			return clientv3.LeaseID(0), mapError(err, false)
		}
		b.mu.Lock()
		b.leases[bucket] = resp.ID
		b.mu.Unlock()
		return resp.ID, nil
	})
	select {
	case r := <-grant:
		if r.Err != nil {
			return 0, r.Err
		}
		return r.Val.(clientv3.LeaseID), nil
	case <-ctx.Done():
		return 0, mapError(ctx.Err(), false)
	}
}

// forget drops a lease the server no longer knows.
func (b *leaseBuckets) forget(id clientv3.LeaseID) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for k, v := range b.leases {
		if v == id {
			delete(b.leases, k)
		}
	}
}

// withLeases runs send with one lease per entry of remaining, each living at
// least that long; if the server lost one of them (the whole Txn then
// failed, nothing was written), it retries once with new ones.
func (b *leaseBuckets) withLeases(ctx context.Context, remaining []time.Duration, send func([]clientv3.LeaseID) error) error {
	for attempt := 0; ; attempt++ {
		ids := make([]clientv3.LeaseID, len(remaining))
		for i, d := range remaining {
			id, err := b.lease(ctx, d)
			if err != nil {
				return err
			}
			ids[i] = id
		}
		err := send(ids)
		if attempt == 0 && errors.Is(err, rpctypes.ErrLeaseNotFound) {
			for _, id := range ids {
				b.forget(id)
			}
			continue
		}
		return err
	}
}
