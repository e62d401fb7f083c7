package memory

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/zlink-systems/authority/conformance"
)

func TestOperationMetrics(t *testing.T) {
	conformance.RunTestOperationMetrics(context.Background(), t, func(t *testing.T, reg prometheus.Registerer) *conformance.Harness {
		return newHarnessWith(t, reg)
	})
}
