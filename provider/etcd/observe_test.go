package etcd_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
)

func TestOperationMetrics(t *testing.T) {
	conformance.RunTestOperationMetrics(t.Context(), t, func(t *testing.T, reg prometheus.Registerer) *conformance.Harness {
		clock := authority.NewManualClock(testEpoch)
		return harnessFor(newStore(t, nil, etcdstore.Config{Clock: clock, Registerer: reg}), clock)
	})
}

// TestOwnerLeaseMetrics: a held lease is counted and has a deadline; one
// revoked behind the store's back is counted lost and no longer held.
func TestOwnerLeaseMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	ns := etcdtest.Namespace()
	s := newStore(t, nil, etcdstore.Config{Namespace: ns, Registerer: reg})
	l, err := s.Registry().Acquire(t.Context(), conformance.NodeA, 1, "owner-m", 5*time.Second)
	require.NoError(t, err)
	held := gauge(t, reg, "authority_owner_leases_held")
	require.Equal(t, 1.0, held)
	left := gauge(t, reg, "authority_owner_lease_min_remaining_seconds")
	require.Greater(t, left, 0.0)
	require.LessOrEqual(t, left, 5.0)

	got, err := shared.Get(t.Context(), ns+"owners/", clientv3.WithPrefix())
	require.NoError(t, err)
	require.Len(t, got.Kvs, 1)
	_, err = shared.Revoke(t.Context(), clientv3.LeaseID(got.Kvs[0].Lease))
	require.NoError(t, err)
	select {
	case <-l.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the store did not notice its lease was revoked")
	}
	require.Eventually(t, func() bool { return gauge(t, reg, "authority_owner_leases_lost_total") == 1 }, 5*time.Second, 10*time.Millisecond)
	require.Equal(t, 0.0, gauge(t, reg, "authority_owner_leases_held"))
}

// gauge returns the value of the unlabelled metric name in reg.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range families {
		if mf.GetName() == name {
			m := mf.GetMetric()[0]
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// spanWorld is two stores on one namespace; the first traces into spans.
type spanWorld struct {
	ctx    context.Context // carries a recording root span
	fx     *conformance.Fixture
	s1, s2 *etcdstore.Store
	spans  *tracetest.InMemoryExporter
	reg    *prometheus.Registry
}

func newSpanWorld(t *testing.T) spanWorld {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	clock := authority.NewManualClock(testEpoch)
	ns, reg := etcdtest.Namespace(), prometheus.NewPedanticRegistry()
	s1 := newStore(t, nil, etcdstore.Config{Clock: clock, Namespace: ns, TracerProvider: tp, Registerer: reg})
	s2 := newStore(t, nil, etcdstore.Config{Clock: clock, Namespace: ns})
	ctx, root := tp.Tracer("test").Start(t.Context(), "request")
	t.Cleanup(func() { root.End() })
	return spanWorld{ctx: ctx, fx: conformance.NewFixture(t, harnessFor(s1, clock)), s1: s1, s2: s2, spans: exp, reg: reg}
}

// failedCompare returns the failed_compare attribute of the last span named
// name, and the etcd round trips recorded under it.
func (w spanWorld) failedCompare(t *testing.T, name string) (string, int) {
	t.Helper()
	spans := w.spans.GetSpans()
	for i := len(spans) - 1; i >= 0; i-- {
		if spans[i].Name != name {
			continue
		}
		children := 0
		for _, c := range spans {
			if c.Parent.SpanID() == spans[i].SpanContext.SpanID() && c.Name == "etcd.Txn" {
				children++
			}
		}
		for _, kv := range spans[i].Attributes {
			if kv.Key == attribute.Key("authority.failed_compare") {
				return kv.Value.AsString(), children
			}
		}
		return "", children
	}
	t.Fatalf("no span %s", name)
	return "", 0
}

func (w spanWorld) spot(t *testing.T, id string) (authority.Key, *authority.Snapshot) {
	r := w.fx.Reserve(authority.ObjectUserSpot, id, conformance.TargetA)
	return r.Key, w.fx.MustCommit(r, []byte("ready"))
}

// TestSpanNamesFailedCompare: for each kind of compare a write can fail, the
// operation's span names it (and the failed-compare metric counts it).
func TestSpanNamesFailedCompare(t *testing.T) {
	t.Run("row_version", func(t *testing.T) {
		w := newSpanWorld(t)
		key, snap := w.spot(t, "rv")
		res, err := w.s2.CompareExchangeAuthority(t.Context(), key, snap.StoreVersion, authority.Put([]byte("other")))
		require.NoError(t, err)
		require.Equal(t, authority.KindStored, res.Kind)
		res, err = w.s1.CompareExchangeAuthority(w.ctx, key, snap.StoreVersion, authority.Put([]byte("stale")))
		require.NoError(t, err)
		require.Equal(t, authority.KindConflict, res.Kind)
		compare, trips := w.failedCompare(t, "authority.compare_exchange")
		require.Equal(t, "row_version", compare)
		require.GreaterOrEqual(t, trips, 1, "etcd round trips are child spans")
		require.Equal(t, 1.0, testutil.ToFloat64(failedCompares(t, w.reg).WithLabelValues("row_version")))
	})
	// a stale version decided from the row read, without a Txn, counts too
	t.Run("row_version_without_txn", func(t *testing.T) {
		w := newSpanWorld(t)
		key, _ := w.spot(t, "rv-local")
		// a version the store never cached: it reads the row and answers
		res, err := w.s1.CompareExchangeAuthority(w.ctx, key, "1", authority.Put([]byte("stale")))
		require.NoError(t, err)
		require.Equal(t, authority.KindConflict, res.Kind)
		compare, _ := w.failedCompare(t, "authority.compare_exchange")
		require.Equal(t, "row_version", compare)
		require.Equal(t, 1.0, testutil.ToFloat64(failedCompares(t, w.reg).WithLabelValues("row_version")))
	})
	t.Run("owner_lease", func(t *testing.T) {
		w := newSpanWorld(t)
		key, snap := w.spot(t, "ol")
		w.fx.SetLive(conformance.TargetA, false)
		res, err := w.s1.CompareExchangeAuthority(w.ctx, key, snap.StoreVersion, authority.Put([]byte("after the lease")))
		require.NoError(t, err)
		require.NotEqual(t, authority.KindStored, res.Kind)
		compare, _ := w.failedCompare(t, "authority.compare_exchange")
		require.Equal(t, "owner_lease", compare)
	})
	t.Run("aggregate_record", func(t *testing.T) {
		w := newSpanWorld(t)
		req := moveRequest(t, w.fx)
		prep, err := w.s1.PrepareAggregate(w.ctx, req)
		require.NoError(t, err)
		require.Equal(t, authority.KindPrepared, prep.Kind)
		aborted, err := w.s2.AbortAggregate(t.Context(), req.Fence())
		require.NoError(t, err)
		require.Equal(t, authority.KindAborted, aborted.Kind)
		_, err = w.s1.CommitAggregate(w.ctx, req.Fence())
		require.NoError(t, err)
		compare, _ := w.failedCompare(t, "authority.commit_aggregate")
		require.Equal(t, "aggregate_record", compare)
	})
	t.Run("capacity_epoch", func(t *testing.T) {
		w := newSpanWorld(t)
		req := moveRequest(t, w.fx)
		moved := false
		w.s1.SetCapacityPolicy(conformance.CapacityPolicyFunc(func(authority.NodeDescriptor, authority.CapacityVector, authority.CapacityVector, authority.CapacityVector) bool {
			if !moved { // another store changes the target node's capacity meanwhile
				moved = true
				res, err := w.s2.Reserve(context.Background(), w.fx.ReserveRequest(authority.ObjectActor, "meanwhile", conformance.TargetB))
				require.NoError(t, err)
				require.Equal(t, authority.KindReserved, res.Kind)
			}
			return true
		}))
		prep, err := w.s1.PrepareAggregate(w.ctx, req)
		require.NoError(t, err)
		require.Equal(t, authority.KindPrepared, prep.Kind)
		require.True(t, moved, "the policy was asked")
		compare, _ := w.failedCompare(t, "authority.prepare_aggregate")
		require.Equal(t, "capacity_epoch", compare)
	})
	t.Run("limit", func(t *testing.T) {
		w := newSpanWorld(t)
		w.s1.SetCapacityPolicy(conformance.ActorLimit(0))
		res, err := w.s1.Reserve(w.ctx, w.fx.ReserveRequest(authority.ObjectActor, "full", conformance.TargetA))
		require.NoError(t, err)
		require.Equal(t, authority.KindPlacementCapacityExhausted, res.Kind)
		compare, _ := w.failedCompare(t, "authority.reserve")
		require.Equal(t, "limit", compare)
	})
}

// moveRequest makes an Actor on TargetA and one on TargetB and returns the
// aggregate that moves the first to TargetB.
func moveRequest(t *testing.T, fx *conformance.Fixture) authority.AggregatePrepareRequest {
	a := fx.Active(authority.ObjectActor, "a1", conformance.TargetA)
	b := fx.Active(authority.ObjectActor, "b1", conformance.TargetB)
	return conformance.AggregateRequest("agg-span", 1, conformance.TargetB, authority.CapacityVector{Actors: 1},
		conformance.Participant(fx.Key(authority.ObjectActor, "a1"), a.StoreVersion, authority.TransitionNewOwner, []byte("moved")),
		conformance.Participant(fx.Key(authority.ObjectActor, "b1"), b.StoreVersion, authority.TransitionPreserve, []byte("kept")),
	)
}

func failedCompares(t *testing.T, reg *prometheus.Registry) *prometheus.CounterVec {
	t.Helper()
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "authority_failed_compares_total",
		Help: "Writes that conflicted or were refused, by the compare that did not hold."}, []string{"compare"})
	var are prometheus.AlreadyRegisteredError
	require.ErrorAs(t, reg.Register(vec), &are)
	return are.ExistingCollector.(*prometheus.CounterVec)
}

// TestOwnerLeaseMetricsOfStoresSharingARegisterer: two stores on one
// Registerer (as Config.Registerer invites) both count in the lease gauges,
// and once the first closes the second's leases still do. Before, the
// gauges stayed bound to the first store: the second's lease showed 0 held
// and +Inf left, and after the first closed, for good.
func TestOwnerLeaseMetricsOfStoresSharingARegisterer(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	ns := etcdtest.Namespace()
	first := newStore(t, nil, etcdstore.Config{Namespace: ns, Registerer: reg})
	second := newStore(t, nil, etcdstore.Config{Namespace: ns, Registerer: reg})
	held := func() float64 { return gauge(t, reg, "authority_owner_leases_held") }
	left := func() float64 { return gauge(t, reg, "authority_owner_lease_min_remaining_seconds") }

	_, err := second.Registry().Acquire(t.Context(), conformance.NodeA, 1, "owner-second", 30*time.Second)
	require.NoError(t, err)
	require.Equal(t, 1.0, held(), "the second store's lease")
	require.Greater(t, left(), 0.0)
	require.LessOrEqual(t, left(), 30.0)

	_, err = first.Registry().Acquire(t.Context(), conformance.NodeB, 1, "owner-first", 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, 2.0, held(), "both stores' leases")
	require.LessOrEqual(t, left(), 5.0, "the shortest of both")

	require.NoError(t, first.Close())
	require.Equal(t, 1.0, held(), "the second store's lease, after the first closed")
	require.Greater(t, left(), 5.0, "the first store's lease no longer counts")
	require.LessOrEqual(t, left(), 30.0)
	require.Equal(t, 0.0, gauge(t, reg, "authority_owner_leases_lost_total"), "closing a store loses no lease")
}
