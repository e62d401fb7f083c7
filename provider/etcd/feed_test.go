package etcd_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	etcdstore "github.com/zlink-systems/authority/provider/etcd"
)

// TestFeedProgressNotifyReliable checks the server versions whose progress
// notifications a view may trust: the fixes of etcd-io/etcd#15220 and
// #17557 landed in 3.4.31 and 3.5.13, and 3.6 has them.
func TestFeedProgressNotifyReliable(t *testing.T) {
	for v, want := range map[string]bool{
		"3.4.23": false, "3.4.30": false, "3.4.31": true, "v3.4.37": true,
		"3.5.0": false, "3.5.12": false, "3.5.13": true, "3.5.21": true,
		"3.6.0": true, "3.7.3": true, "3.3.27": false, "": false, "garbage": false,
	} {
		require.Equal(t, want, etcdstore.ProgressNotifyReliable(v), v)
	}
}
