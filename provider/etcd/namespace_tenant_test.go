package etcd_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The namespace rule lets a store nest in another's namespace under a
// segment that is not the layout's; the two then share no key range: the
// outer store neither reads nor lists the inner store's rows, and decodes
// every key of it as EntryUnknown, not as corrupt.
func TestNestedNamespaceOutsideTheLayoutIsIsolated(t *testing.T) {
	clock := authority.NewManualClock(testEpoch)
	outer := newStore(t, nil, etcdstore.Config{Clock: clock})
	inner := newStore(t, nil, etcdstore.Config{Clock: clock, Namespace: outer.Namespace() + "tenant/"})
	fx := conformance.NewFixture(t, harnessFor(inner, clock))
	fx.Active(authority.ObjectActor, "victim", conformance.TargetA)
	fx.Reserve(authority.ObjectUserSpot, "pending", conformance.TargetA)
	ctx := context.Background()

	res, err := outer.ReadAuthority(ctx, fx.Key(authority.ObjectActor, "victim"))
	require.NoError(t, err)
	require.Equal(t, authority.KindMissing, res.Kind)
	page, err := outer.ListAuthorities(ctx, "", "", authority.MaxScanLimit)
	require.NoError(t, err)
	require.Empty(t, page.Items)

	all, err := shared.Get(ctx, outer.Namespace(), clientv3.WithPrefix())
	require.NoError(t, err)
	require.NotEmpty(t, all.Kvs)
	for _, kv := range all.Kvs {
		e, err := etcdstore.DecodeEntry(outer.Namespace(), kv)
		require.NoError(t, err, "key %q", kv.Key)
		require.Equal(t, etcdstore.EntryUnknown, e.Kind, "key %q", kv.Key)
	}
}
