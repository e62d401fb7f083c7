package conformance

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
)

// ObservedFactory returns a fresh store, like Factory, that registers its
// metrics on reg.
type ObservedFactory func(t *testing.T, reg prometheus.Registerer) *Harness

// opTally counts outcomes by operation label and outcome label, as the
// workload saw them returned.
type opTally map[[2]string]float64

func (o opTally) add(op string, kind authority.ResultKind, err error) {
	outcome := string(kind)
	if err != nil {
		outcome = "error"
	}
	o[[2]string{op, outcome}]++
}

// RunTestOperationMetrics runs a scripted workload — reservations, commits,
// a conflicting and an invalid compare-and-swap, an aggregate move, a
// reservation on an owner whose lease ended — and checks that
// authority_operations_total holds exactly the outcomes the operations
// returned, that the latency histogram counted each operation once, and that
// the invalid argument is counted by its sentinel.
func RunTestOperationMetrics(ctx context.Context, t *testing.T, f ObservedFactory) {
	reg := prometheus.NewPedanticRegistry()
	fx := NewFixtureContext(ctx, t, f(t, reg))
	s, seen := fx.Store(), opTally{}

	r := fx.Reserve(authority.ObjectUserSpot, "m-a", TargetA)
	seen.add("reserve", authority.KindReserved, nil)
	snap := fx.MustCommit(r, []byte("ready"))
	seen.add("commit", authority.KindCommitted, nil)
	key := fx.Key(authority.ObjectUserSpot, "m-a")
	put := func(v authority.StoreVersion) authority.CompareExchangeResult {
		res, err := s.CompareExchangeAuthority(fx.Ctx(), key, v, authority.Put([]byte("p")))
		seen.add("compare_exchange", res.Kind, err)
		return res
	}
	stored := put(snap.StoreVersion)
	require.Equal(t, authority.KindStored, stored.Kind)
	require.Equal(t, authority.KindConflict, put(snap.StoreVersion).Kind)
	_, err := s.CompareExchangeAuthority(fx.Ctx(), key, stored.Snapshot.StoreVersion, authority.Mutation{Kind: "upsert"})
	seen.add("compare_exchange", "", err)
	require.ErrorIs(t, err, authority.ErrInvalidArgument)
	read, err := s.ReadAuthority(fx.Ctx(), key)
	seen.add("read", read.Kind, err)
	require.NoError(t, err)

	runObservedMove(t, fx, seen)

	fx.SetLive(TargetA, false)
	refused, err := s.Reserve(fx.Ctx(), fx.ReserveRequest(authority.ObjectActor, "m-lost", TargetA))
	seen.add("reserve", refused.Kind, err)
	require.NoError(t, err)
	require.NotEqual(t, authority.KindReserved, refused.Kind, "a reservation on an owner whose lease ended")

	requireOperationCounts(t, reg, seen)
}

// runObservedMove moves an Actor from TargetA to TargetB by an aggregate,
// tallying every operation it runs.
func runObservedMove(t *testing.T, fx *Fixture, seen opTally) {
	m := newMove(fx) // two Actors: a reservation and a completion each
	seen[[2]string{"reserve", "reserved"}] += 2
	seen[[2]string{"complete_creation", "created"}] += 2
	prep, err := fx.Store().PrepareAggregate(fx.Ctx(), m.req)
	seen.add("prepare_aggregate", prep.Kind, err)
	require.NoError(t, err)
	require.Equal(t, authority.KindPrepared, prep.Kind)
	done, err := fx.Store().CommitAggregate(fx.Ctx(), m.req.Fence())
	seen.add("commit_aggregate", done.Kind, err)
	require.NoError(t, err)
	require.Equal(t, authority.KindCommitted, done.Kind)
}

// requireOperationCounts compares the registry's operation counters with
// the tally, series by series.
func requireOperationCounts(t *testing.T, reg *prometheus.Registry, want opTally) {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	got, perOp, histCount, errs := opTally{}, map[string]float64{}, map[string]float64{}, opTally{}
	for _, mf := range families {
		for _, m := range mf.GetMetric() {
			l := labels(m)
			switch mf.GetName() {
			case "authority_operations_total":
				if l["operation"] == "wait_for_change" || l["operation"] == "capacity_usage" {
					continue // fixtures may wait or read usage internally
				}
				got[[2]string{l["operation"], l["outcome"]}] += m.GetCounter().GetValue()
				perOp[l["operation"]] += m.GetCounter().GetValue()
			case "authority_operation_duration_seconds":
				histCount[l["operation"]] = float64(m.GetHistogram().GetSampleCount())
			case "authority_operation_errors_total":
				if v := m.GetCounter().GetValue(); v != 0 { // known label values start at 0
					errs[[2]string{l["operation"], l["error"]}] += v
				}
			}
		}
	}
	require.Equal(t, want, got, "authority_operations_total by operation and outcome")
	for op, n := range perOp {
		require.Equal(t, n, histCount[op], "latency samples of %s", op)
	}
	require.Equal(t, opTally{{"compare_exchange", "invalid_argument"}: 1}, errs, "authority_operation_errors_total")
}

func labels(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, p := range m.GetLabel() {
		out[p.GetName()] = p.GetValue()
	}
	return out
}
