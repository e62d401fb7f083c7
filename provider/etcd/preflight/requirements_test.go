package preflight_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/zlink-systems/authority/provider/etcd/preflight"
)

// TestServerRequirementsFor: each server version gets the lease-checkpoint
// flags it knows (a flag it does not know stops it at start); the other
// requirements are the same everywhere.
func TestServerRequirementsFor(t *testing.T) {
	flags := func(version string) []string {
		var out []string
		for _, r := range preflight.ServerRequirementsFor(version) {
			out = append(out, r.Arg())
		}
		return out
	}
	common := []string{"--max-txn-ops=1024", "--max-request-bytes=4194304", "--auto-compaction-retention=1h"}
	gates := "--feature-gates=LeaseCheckpoint=true,LeaseCheckpointPersist=true"
	for version, want := range map[string][]string{
		"v3.4.0":     {"--experimental-enable-lease-checkpoint"},
		"3.4.19":     {"--experimental-enable-lease-checkpoint"},
		"3.4.23":     {"--experimental-enable-lease-checkpoint", "--experimental-enable-lease-checkpoint-persist"},
		"3.5.1":      {"--experimental-enable-lease-checkpoint"},
		"3.5.2":      {"--experimental-enable-lease-checkpoint", "--experimental-enable-lease-checkpoint-persist"},
		"3.5.21":     {"--experimental-enable-lease-checkpoint", "--experimental-enable-lease-checkpoint-persist"},
		"3.6.0-rc.1": {gates},
		"3.6.5":      {gates},
		"3.7.3":      {gates},
		"":           {gates},
		"garbage":    {gates},
	} {
		require.Equal(t, append(append([]string{}, common...), want...), flags(version), version)
	}
	var def []string
	for _, r := range preflight.ServerRequirements {
		def = append(def, r.Arg())
	}
	require.Equal(t, flags("3.6.0"), def, "ServerRequirements are those of 3.6+")

	// the boolean flags are checked as present ("true") or not
	for _, r := range preflight.ServerRequirementsFor("3.5.21")[3:] {
		require.NoError(t, r.Check("true"), r.Flag)
		require.Error(t, r.Check(""), r.Flag)
		require.Error(t, r.Check("false"), r.Flag)
	}
}
