package observe

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// TestCountersOfKnownLabelsStartAtZero: on a store that has done nothing,
// every failed-compare kind, every operation's retries and every
// operation's error sentinel are series at 0, so dashboards and alerts read
// 0 rather than "No data".
func TestCountersOfKnownLabelsStartAtZero(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	o := New(Config{Registerer: reg})
	require.NotNil(t, o)
	for name, want := range map[string]int{
		"authority_failed_compares_total":  len(compares),
		"authority_etcd_retries_total":     int(numOperations),
		"authority_operation_errors_total": int(numOperations) * len(sentinels),
	} {
		got, err := testutil.GatherAndCount(reg, name)
		require.NoError(t, err)
		require.Equal(t, want, got, name)
	}
	require.Equal(t, 0.0, testutil.ToFloat64(o.metrics.failedCompares.WithLabelValues(string(CompareOwnerLease))))
	require.Equal(t, 0.0, testutil.ToFloat64(o.metrics.operationErrs.WithLabelValues(OpReserve.String(), "outcome_unknown")))
	require.Equal(t, 0.0, testutil.ToFloat64(o.metrics.retries.WithLabelValues(OpCommit.String())))
}
