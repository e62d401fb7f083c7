package etcd

import (
	"context"
	"errors"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// keepAliveRetry is how soon a renewal that failed is tried again (while the
// deadline allows).
const keepAliveRetry = 250 * time.Millisecond

// keepAlive renews l's lease every third of its TTL until ctx ends (Close),
// etcd answers that the lease is gone, or l's deadline passes with no
// renewal confirmed; then it returns (and Done closes).
//
// Each renewal is one KeepAliveOnce, so its send time is known: a confirmed
// renewal moves the deadline to that send time plus the TTL etcd confirmed,
// never past the lease's expiry at etcd. (The client's own KeepAlive stream
// measures from when a reply arrives, which is later than etcd's clock
// started, so it can report a lease live after etcd expired it.) A renewal
// counts only once a linearizable read in the same raft term follows it
// (confirmRenewal): a leader that was paused and resumes can renew a lease
// in its own lessor before it learns that another member leads, and the
// real leader then expires the lease on its own earlier clock.
func (l *OwnerLease) keepAlive(ctx context.Context, ttl time.Duration) {
	c := l.r.s.client
	wait := max(ttl/3, time.Second/2)
	for {
		deadline := l.Deadline()
		timer := time.NewTimer(min(wait, time.Until(deadline)))
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-l.r.s.guard.Regressed():
			timer.Stop()
			return // the cluster went back in time: the lease may name another state
		case <-timer.C:
		}
		if !time.Now().Before(deadline) {
			return // no renewal confirmed in time: the lease may be gone
		}
		sent := time.Now()
		rctx, cancel := context.WithDeadline(ctx, deadline)
		resp, err := c.KeepAliveOnce(rctx, l.lease)
		cancel()
		if err == nil && l.r.s.guard.ObserveCluster(resp.ResponseHeader) != nil {
			return // another cluster answered (restored with a new token)
		}
		switch {
		case err == nil && resp.TTL > 0 && !l.confirmRenewal(ctx, deadline, resp.ResponseHeader):
			wait = keepAliveRetry // renewed by a leader that is no longer one, maybe: renew again
			l.r.s.obs.Metrics().KeepAliveFailed()
		case err == nil && resp.TTL > 0:
			next := sent.Add(time.Duration(resp.TTL) * time.Second)
			l.deadline.Store(&next)
			l.r.s.obs.Metrics().LeaseDeadline(int64(l.lease), next)
			wait = max(time.Duration(resp.TTL)*time.Second/3, time.Second/2)
		case err == nil, errors.Is(err, rpctypes.ErrLeaseNotFound):
			return // etcd says it expired or was revoked
		case ctx.Err() != nil, c.Ctx().Err() != nil:
			return // closed, or the client is
		default:
			wait = keepAliveRetry // unreachable, or slow: try again until the deadline
			l.r.s.obs.Metrics().KeepAliveFailed()
			l.r.s.obs.Logger().Warn("owner lease keep-alive failed", "owner", l.token.OwnerID,
				"leaseGeneration", l.token.LeaseGeneration, "leftUntilDeadline", time.Until(deadline).String(), "error", err)
		}
	}
}

// ended records that l's keep-alive stopped: lost when neither Close nor
// Store.Close stopped it.
func (l *OwnerLease) ended(lost bool) {
	o := l.r.s.obs
	o.Metrics().LeaseEnded(int64(l.lease), lost)
	if lost {
		o.Logger().Warn("owner lease lost", "owner", l.token.OwnerID, "leaseGeneration", l.token.LeaseGeneration)
	}
}

// confirmRenewal reports whether the renewal answered with hdr was made by
// the leader of its raft term while that leader still led: a linearizable
// read (the member confirms its leader with a quorum) of l's liveness key,
// in the same term, finds the key. A stale leader's renewal fails this: its
// read cannot reach a quorum, or it comes back in the newer term.
func (l *OwnerLease) confirmRenewal(ctx context.Context, deadline time.Time, hdr *pb.ResponseHeader) bool {
	if hdr == nil {
		return false
	}
	rctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	s := l.r.s
	r, err := s.kv.Get(rctx, s.keys.Liveness(l.node, l.lifecycle, l.token), clientv3.WithCountOnly())
	return err == nil && r.Header != nil && r.Header.RaftTerm == hdr.RaftTerm && r.Count == 1
}
