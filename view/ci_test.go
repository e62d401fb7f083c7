package view_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCIRunsViewOnStandaloneServers: .ci/run's suite against each server of
// .ci/etcd-versions (run_suite) runs the view's tests and the coordinator
// scenarios read through a view, where the view's fallback to the store is
// the only path on servers before 3.4.31 / 3.5.13.
func TestCIRunsViewOnStandaloneServers(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", ".ci", "run"))
	require.NoError(t, err)
	script := string(b)
	start := strings.Index(script, "\nrun_suite() {")
	require.GreaterOrEqual(t, start, 0, ".ci/run has no run_suite")
	end := strings.Index(script[start:], "\n}\n")
	require.Greater(t, end, 0)
	suite := script[start : start+end]
	require.Contains(t, suite, `AUTHORITY_ETCD_ENDPOINTS="$endpoints"`)
	require.Contains(t, suite, "go test -count=1 -v ./view/")
	require.Contains(t, suite, "-run '^TestScenariosEtcd(View)?$' ./coordinator/")
}
