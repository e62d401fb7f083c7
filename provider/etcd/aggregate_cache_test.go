package etcd_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// aggregatePair is two stores on one namespace (and their round-trip
// counter: every KV call of the first store's client) with an aggregate
// moving Actor a1 from TargetA to TargetB next to b1 kept on TargetB.
type aggregatePair struct {
	rpcs   *atomic.Int64
	clock  *authority.ManualClock
	s1, s2 *etcdstore.Store
	fx     *conformance.Fixture
	req    authority.AggregatePrepareRequest
	a1     authority.Key
}

func newAggregatePair(t *testing.T) *aggregatePair {
	p := &aggregatePair{rpcs: &atomic.Int64{}}
	c := server.Client(t)
	c.KV = countingKV{c.KV, p.rpcs}
	clock := authority.NewManualClock(testEpoch)
	p.clock = clock
	p.s1 = newStore(t, c, etcdstore.Config{Clock: clock})
	p.s2 = newStore(t, nil, etcdstore.Config{Clock: clock, Namespace: p.s1.Namespace(), SkipVersionCheck: true})
	p.fx = conformance.NewFixture(t, harnessFor(p.s1, clock))
	a1 := p.fx.Active(authority.ObjectActor, "a1", conformance.TargetA)
	b1 := p.fx.Active(authority.ObjectActor, "b1", conformance.TargetB)
	p.a1 = p.fx.Key(authority.ObjectActor, "a1")
	p.req = conformance.AggregateRequest("agg-1", 1, conformance.TargetB, authority.CapacityVector{Actors: 1},
		conformance.Participant(p.a1, a1.StoreVersion, authority.TransitionNewOwner, []byte("a1-moved")),
		conformance.Participant(p.fx.Key(authority.ObjectActor, "b1"), b1.StoreVersion, authority.TransitionPreserve, []byte("b1-kept")),
	)
	return p
}

func (p *aggregatePair) commit(t *testing.T, s *etcdstore.Store, fence authority.Fence) authority.ResultKind {
	t.Helper()
	res, err := s.CommitAggregate(context.Background(), fence)
	require.NoError(t, err)
	return res.Kind
}

func (p *aggregatePair) abort(t *testing.T, s *etcdstore.Store, fence authority.Fence) authority.ResultKind {
	t.Helper()
	res, err := s.AbortAggregate(context.Background(), fence)
	require.NoError(t, err)
	return res.Kind
}

// TestAggregateRoundTrips: the store that prepared an aggregate commits or
// aborts it in one Txn, without reading the record again.
func TestAggregateRoundTrips(t *testing.T) {
	p := newAggregatePair(t)
	before := p.rpcs.Load()
	fence := p.fx.MustPrepare(p.req)
	require.Equal(t, int64(2), p.rpcs.Load()-before, "prepare: one read, one Txn")
	before = p.rpcs.Load()
	require.Equal(t, authority.KindCommitted, p.commit(t, p.s1, fence))
	require.Equal(t, int64(1), p.rpcs.Load()-before, "commit")
	before = p.rpcs.Load()
	require.Equal(t, authority.KindAlreadyCommitted, p.commit(t, p.s1, fence))
	require.Equal(t, int64(0), p.rpcs.Load()-before, "a committed record never changes")
	require.Equal(t, []byte("a1-moved"), p.fx.MustRow(p.a1).Payload)

	p = newAggregatePair(t) // a fresh namespace
	fence = p.fx.MustPrepare(p.req)
	before = p.rpcs.Load()
	require.Equal(t, authority.KindAborted, p.abort(t, p.s1, fence))
	require.Equal(t, int64(1), p.rpcs.Load()-before, "abort")
}

// TestAggregateKnownRecordCommittedElsewhere: the preparing store's memory
// of the record goes stale when another store commits it; its commit then
// reports alreadyCommitted and its abort stale, as the record says.
func TestAggregateKnownRecordCommittedElsewhere(t *testing.T) {
	p := newAggregatePair(t)
	fence := p.fx.MustPrepare(p.req)
	require.Equal(t, authority.KindCommitted, p.commit(t, p.s2, fence))
	require.Equal(t, authority.KindAlreadyCommitted, p.commit(t, p.s1, fence))
	require.Equal(t, authority.KindStale, p.abort(t, p.s1, fence))
	require.Equal(t, []byte("a1-moved"), p.fx.MustRow(p.a1).Payload)
}

// TestAggregateKnownRecordAbortedElsewhere: the same when another store
// aborted it.
func TestAggregateKnownRecordAbortedElsewhere(t *testing.T) {
	p := newAggregatePair(t)
	fence := p.fx.MustPrepare(p.req)
	require.Equal(t, authority.KindAborted, p.abort(t, p.s2, fence))
	require.Equal(t, authority.KindStale, p.commit(t, p.s1, fence))
	require.Equal(t, authority.KindAlreadyAborted, p.abort(t, p.s1, fence))
	require.Equal(t, conformance.TargetA.Owner, p.fx.MustRow(p.a1).Owner(), "a1 did not move")
}

// TestAggregateKnownRecordParticipantMoved: a participant changed by
// another store after the prepare makes the commit stale and leaves the
// aggregate prepared, so it can still be aborted.
func TestAggregateKnownRecordParticipantMoved(t *testing.T) {
	p := newAggregatePair(t)
	fence := p.fx.MustPrepare(p.req)
	cur := p.fx.MustRow(p.a1)
	put, err := p.s2.CompareExchangeAuthority(context.Background(), p.a1, cur.StoreVersion, authority.Put([]byte("elsewhere")))
	require.NoError(t, err)
	require.Equal(t, authority.KindStored, put.Kind)
	require.Equal(t, authority.KindStale, p.commit(t, p.s1, fence))
	require.Equal(t, authority.KindAborted, p.abort(t, p.s1, fence))
	require.Equal(t, []byte("elsewhere"), p.fx.MustRow(p.a1).Payload)
}

// TestAggregateKnownRecordRowsForgotten: when the preparing store no longer
// has the participants' rows, its commit reads them with the record, and an
// aggregate committed elsewhere meanwhile is alreadyCommitted, not stale.
func TestAggregateKnownRecordRowsForgotten(t *testing.T) {
	p := newAggregatePair(t)
	fence := p.fx.MustPrepare(p.req)
	require.Equal(t, authority.KindCommitted, p.commit(t, p.s2, fence))
	etcdstore.ForgetRows(p.s1)
	before := p.rpcs.Load()
	require.Equal(t, authority.KindAlreadyCommitted, p.commit(t, p.s1, fence))
	require.Equal(t, int64(1), p.rpcs.Load()-before, "one read of the rows and the record")

	// and the aggregate it still knows as prepared commits after the read
	p = newAggregatePair(t)
	fence = p.fx.MustPrepare(p.req)
	etcdstore.ForgetRows(p.s1)
	before = p.rpcs.Load()
	require.Equal(t, authority.KindCommitted, p.commit(t, p.s1, fence))
	require.Equal(t, int64(2), p.rpcs.Load()-before, "a read of the rows and the record, the Txn")
}

// TestFinishedAggregateRecordsExpire: committed and aborted aggregate
// records sit on a lease that outlives the retention (so etcd does not keep
// them forever); a prepared record has none.
func TestFinishedAggregateRecordsExpire(t *testing.T) {
	p := newAggregatePair(t)
	ctx := context.Background()
	fence := p.fx.MustPrepare(p.req)
	key := p.s1.Namespace() + "aggregates/agg-1/1"
	leaseOf := func() int64 {
		resp, err := shared.Get(ctx, key)
		require.NoError(t, err)
		require.Len(t, resp.Kvs, 1)
		return resp.Kvs[0].Lease
	}
	require.Zero(t, leaseOf(), "a prepared aggregate never expires")
	require.Equal(t, authority.KindCommitted, p.commit(t, p.s1, fence))
	lease := leaseOf()
	require.NotZero(t, lease)
	ttl, err := shared.TimeToLive(ctx, clientv3.LeaseID(lease))
	require.NoError(t, err)
	require.GreaterOrEqual(t, time.Duration(ttl.TTL)*time.Second, p.s1.RecordRetention())
}

// A finished record this store remembers stops counting once it expires:
// another store may prepare the same fence again meanwhile, and this store
// must then see that record, not answer from the expired one.
func TestExpiredRememberedAggregateIsReadAgain(t *testing.T) {
	for _, op := range []string{"commit", "abort"} {
		t.Run(op, func(t *testing.T) {
			p := newAggregatePair(t)
			fence := p.fx.MustPrepare(p.req)
			require.Equal(t, authority.KindAborted, p.abort(t, p.s1, fence))
			p.clock.Advance(etcdstore.DefaultReservationRetention + time.Minute)
			res, err := p.s2.PrepareAggregate(context.Background(), p.req)
			require.NoError(t, err)
			require.Equal(t, authority.KindPrepared, res.Kind, "the expired record does not count")
			if op == "commit" {
				require.Equal(t, authority.KindCommitted, p.commit(t, p.s1, fence))
				require.Equal(t, authority.KindAlreadyCommitted, p.commit(t, p.s2, fence))
			} else {
				require.Equal(t, authority.KindAborted, p.abort(t, p.s1, fence))
				require.Equal(t, authority.KindAlreadyAborted, p.abort(t, p.s2, fence))
			}
		})
	}
}

// A prepare whose Txn fails because another store prepared the identical
// request meanwhile answers alreadyPrepared, even though a preserve
// participant's owner died too: the record decides before any liveness.
func TestPrepareLosingToTheSameRequestIsAlreadyPrepared(t *testing.T) {
	p := newAggregatePair(t)
	stall := stallFirstDecision(p.s1)
	var res authority.PrepareAggregateResult
	var perr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		res, perr = p.s1.PrepareAggregate(context.Background(), p.req)
	}()
	<-stall.entered
	other, err := p.s2.PrepareAggregate(context.Background(), p.req)
	require.NoError(t, err)
	require.Equal(t, authority.KindPrepared, other.Kind)
	p.fx.SetLive(conformance.TargetB, false) // b1's owner (and the target's)
	close(stall.release)
	<-done
	require.NoError(t, perr)
	require.Equal(t, authority.KindAlreadyPrepared, res.Kind)
	require.Equal(t, other.Fence, res.Fence)
}

// A store that remembers an aggregate as prepared, after another store
// aborted it and (past the retention) prepared the same request again,
// answers from the record now in etcd: its commit commits, its abort aborts
// (it used to answer stale, leaving the capacity held).
func TestRememberedPreparedAggregatePreparedAgainElsewhere(t *testing.T) {
	for _, op := range []string{"commit", "abort"} {
		t.Run(op, func(t *testing.T) {
			p := newAggregatePair(t)
			fence := p.fx.MustPrepare(p.req) // store 1 remembers it prepared
			require.Equal(t, authority.KindAborted, p.abort(t, p.s2, fence))
			p.clock.Advance(etcdstore.DefaultReservationRetention + time.Minute)
			res, err := p.s2.PrepareAggregate(context.Background(), p.req)
			require.NoError(t, err)
			require.Equal(t, authority.KindPrepared, res.Kind)
			if op == "commit" {
				require.Equal(t, authority.KindCommitted, p.commit(t, p.s1, fence))
				require.Equal(t, authority.KindAlreadyCommitted, p.commit(t, p.s1, fence))
				require.Equal(t, []byte("a1-moved"), p.fx.MustRow(p.a1).Payload)
			} else {
				require.Equal(t, authority.KindAborted, p.abort(t, p.s1, fence))
				require.Equal(t, authority.KindAlreadyAborted, p.abort(t, p.s1, fence))
			}
		})
	}
}
