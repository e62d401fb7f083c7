package etcd_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// namespaceRevision is the newest ModRevision of any key under ns (0 when
// there is none): a refused call that wrote nothing leaves it unchanged.
func namespaceRevision(t *testing.T, ns string) (int64, int) {
	t.Helper()
	resp, err := shared.Get(context.Background(), ns, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	require.NoError(t, err)
	var newest int64
	for _, kv := range resp.Kvs {
		newest = max(newest, kv.ModRevision)
	}
	return newest, len(resp.Kvs)
}

// Bad owner-lease input is ErrInvalidArgument before anything is sent: a
// node whose mesh name or RID the layout cannot store, an empty owner, and a
// TTL etcd would refuse with an error that wraps no sentinel.
func TestOwnerLeaseRefusesBadInputWritingNothing(t *testing.T) {
	ns := etcdtest.Namespace()
	s := newStore(t, nil, etcdstore.Config{Namespace: ns})
	ctx := context.Background()
	node := conformance.NodeA
	cases := []struct {
		name  string
		node  authority.NodeDescriptor
		owner string
		ttl   time.Duration
	}{
		{"mesh name not UTF-8", authority.NodeDescriptor{MeshName: "m\xff", RID: node.RID}, "o", 10 * time.Second},
		{"empty RID", authority.NodeDescriptor{MeshName: node.MeshName}, "o", 10 * time.Second},
		{"empty mesh name", authority.NodeDescriptor{RID: node.RID}, "o", 10 * time.Second},
		{"NUL in RID", authority.NodeDescriptor{MeshName: node.MeshName, RID: "a\x00b"}, "o", 10 * time.Second},
		{"empty owner", node, "", 10 * time.Second},
		{"TTL of 290 years", node, "o", 290 * 365 * 24 * time.Hour},
		{"TTL zero", node, "o", 0},
		{"TTL negative", node, "o", -time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before, n := namespaceRevision(t, ns)
			l, err := s.Registry().Acquire(ctx, tc.node, conformance.NodeLifecycle, tc.owner, tc.ttl)
			if l != nil {
				_ = l.Close(ctx)
			}
			require.ErrorIs(t, err, authority.ErrInvalidArgument, "Acquire")
			owner := authority.OwnerToken{OwnerID: tc.owner, LeaseGeneration: 1}
			require.ErrorIs(t, s.MarkLive(ctx, tc.node, conformance.NodeLifecycle, owner, tc.ttl), authority.ErrInvalidArgument, "MarkLive")
			after, m := namespaceRevision(t, ns)
			require.Equal(t, before, after, "a refused owner lease wrote to the namespace")
			require.Equal(t, n, m)
		})
	}
}
