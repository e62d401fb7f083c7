package etcd

import (
	"context"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// followVersion follows the active-version key from the revision after rev
// with a watch, and keeps the store's announcement lease alive, announcing
// again on a new lease when it is lost, until the store closes.
func (s *Store) followVersion(rev int64) {
	defer close(s.version.followed)
	for s.life.Err() == nil {
		ctx, cancel := context.WithCancel(s.life)
		s.followWhileAnnounced(ctx, rev, s.keepAnnouncement(ctx))
		cancel()
		// the lease was lost: announce anew, which also reads the version
		for backoff := time.Second; s.life.Err() == nil; backoff = min(2*backoff, 30*time.Second) {
			actx, acancel := context.WithTimeout(s.life, max(s.dialTimeout, announceTTL))
			r, err := s.announce(actx)
			acancel()
			if err == nil {
				rev = r
				break
			}
			if s.versionSkew() != nil {
				s.obs.Logger().Error("store version skew: this store refuses every request", "err", err)
				return
			}
			s.obs.Logger().Warn("announcing the store failed; retrying", "err", err, "in", backoff)
			sleepOrDone(s.life, backoff)
		}
	}
}

// followWhileAnnounced watches the active version until lost closes (or
// ctx ends); a watch that fails (compaction, no leader, a revoked
// permission) is replaced by a read and a new watch, backing off while the
// read fails.
func (s *Store) followWhileAnnounced(ctx context.Context, rev int64, lost <-chan struct{}) {
	backoff := time.Second
	for ctx.Err() == nil {
		if s.watchVersion(ctx, rev, lost) {
			return
		}
		rctx, cancel := s.requestContext(ctx)
		resp, err := s.kv.Get(rctx, s.keys.ActiveVersion())
		cancel()
		if err == nil {
			err = s.learnVersion(firstKV((*pb.RangeResponse)(resp)))
		}
		if err != nil {
			s.obs.Logger().Warn("reading the store version failed; retrying", "err", err, "in", backoff)
			sleepOrDone(ctx, backoff)
			backoff = min(2*backoff, 30*time.Second)
			continue
		}
		rev, backoff = resp.Header.Revision, time.Second
	}
}

// keepAnnouncement keeps the store's announcement lease alive; the
// returned channel closes when it is lost.
func (s *Store) keepAnnouncement(ctx context.Context) <-chan struct{} {
	lost := make(chan struct{})
	ch, err := s.client.KeepAlive(ctx, clientv3.LeaseID(s.version.lease.Load()))
	if err != nil {
		close(lost)
		return lost
	}
	go func() {
		defer close(lost)
		for range ch { // drained, so the client keeps sending renewals
		}
	}()
	return lost
}

// watchVersion applies every change of the active-version key after rev
// until ctx ends or the watch fails; it reports whether lost closed (or ctx
// ended).
func (s *Store) watchVersion(ctx context.Context, rev int64, lost <-chan struct{}) bool {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := s.client.Watch(wctx, s.keys.ActiveVersion(), clientv3.WithRev(rev+1))
	for {
		select {
		case <-lost:
			return true
		case <-ctx.Done():
			return true
		case wr, ok := <-wch:
			if !ok || wr.Err() != nil {
				return false
			}
			for _, ev := range wr.Events {
				if ev.Type != clientv3.EventTypePut {
					continue // a deleted key is a deleted namespace: keep the version seen
				}
				if err := s.learnVersion(ev.Kv); err != nil {
					s.obs.Logger().Error("store version changed", "err", err)
				}
			}
		}
	}
}

// sleepOrDone waits d or until ctx ends.
func sleepOrDone(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
