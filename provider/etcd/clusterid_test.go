package etcd_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestClusterIDIsTheServersClusterID: the store names the cluster its
// responses come from, as etcdctl prints it, also when New made no request
// (SkipVersionCheck).
func TestClusterIDIsTheServersClusterID(t *testing.T) {
	ctx := context.Background()
	resp, err := shared.Get(ctx, etcdtest.Namespace()+"cluster-id-probe", clientv3.WithCountOnly())
	require.NoError(t, err)
	want := fmt.Sprintf("%x", resp.Header.ClusterId)
	require.NotEqual(t, "0", want)
	for _, skip := range []bool{false, true} {
		s := newStore(t, nil, etcdstore.Config{SkipVersionCheck: skip})
		got, err := s.ClusterID(ctx)
		require.NoError(t, err)
		require.Equal(t, want, got, "SkipVersionCheck %v", skip)
	}
}
