package etcd_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	"github.com/zlink-systems/authority/internal/testkit/shardtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/etcd/storeversion"
)

// namespaceAt returns a fresh namespace whose active version is v (as a
// namespace finalized to v and never further), deleted at t's cleanup.
func namespaceAt(t testing.TB, v storeversion.Version) string {
	t.Helper()
	ns := etcdtest.Namespace()
	if _, err := shared.Put(context.Background(), schema.NewLayout(ns).ActiveVersion(), schema.EncodeActiveVersion(v)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = shared.Delete(context.Background(), ns, clientv3.WithPrefix()) })
	return ns
}

// TestConformanceBeforeCompactFormat runs the conformance suite on a
// namespace at the version before storeversion.CompactFormat, where the
// store writes format 1 (TestConformance runs it at Latest, the compact
// format): both formats keep every property the suite checks.
func TestConformanceBeforeCompactFormat(t *testing.T) {
	conformance.RunAll(t.Context(), t, func(t *testing.T) *conformance.Harness {
		clock := authority.NewManualClock(testEpoch)
		claims := &shardtest.Claims{}
		s := newStore(t, nil, etcdstore.Config{Namespace: namespaceAt(t, storeversion.CompactFormat-1), Clock: clock, IdentityClaims: claims})
		require.Equal(t, storeversion.CompactFormat-1, s.ActiveVersion())
		h := harnessFor(s, clock)
		h.ClaimIdentity = func(_ testing.TB, key authority.Key) { claims.Claim(key) }
		return h
	})
}

// rawValue is the stored value of key.
func rawValue(t *testing.T, key string) []byte {
	t.Helper()
	resp, err := shared.Get(context.Background(), key)
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1, "key %s", key)
	return resp.Kvs[0].Value
}

// TestCompactFormatIsGated: a namespace before CompactFormat stores rows
// and capacity entries in format 1; once finalized, new writes are compact,
// rows of format 1 still read, and rewriting one stores it compact.
func TestCompactFormatIsGated(t *testing.T) {
	ctx := context.Background()
	clock := authority.NewManualClock(testEpoch)
	ns := namespaceAt(t, storeversion.CompactFormat-1)
	s := newStore(t, nil, etcdstore.Config{Namespace: ns, Clock: clock})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	l := schema.NewLayout(ns)
	formats := func(id string) (row, capacity byte) {
		key := fx.Key(authority.ObjectActor, id)
		r := fx.MustRow(key)
		return rawValue(t, l.Row(key))[0], rawValue(t, l.CapacityRow(r.Allocation, key))[0]
	}
	old := fx.Active(authority.ObjectActor, "old", conformance.TargetA)
	row, capacity := formats("old")
	require.Equal(t, byte(1), row, "format 1 before CompactFormat")
	require.Equal(t, byte('{'), capacity, "JSON capacity entry before CompactFormat")

	_, err := s.Finalize(ctx, storeversion.CompactFormat, false)
	require.NoError(t, err)
	fx.Active(authority.ObjectActor, "new", conformance.TargetA)
	row, capacity = formats("new")
	require.Equal(t, byte(2), row, "compact row at CompactFormat")
	require.Equal(t, byte(0), capacity, "compact capacity entry at CompactFormat")

	oldKey := fx.Key(authority.ObjectActor, "old")
	require.Equal(t, old.Payload, fx.MustRow(oldKey).Payload, "a format-1 row reads after finalize")
	res, err := s.CompareExchangeAuthority(ctx, oldKey, old.StoreVersion, authority.Put([]byte("rewritten")))
	require.NoError(t, err)
	require.Equal(t, authority.KindStored, res.Kind)
	require.Equal(t, byte(2), rawValue(t, l.Row(oldKey))[0], "a rewritten row is stored compact")
	require.Equal(t, []byte("rewritten"), fx.MustRow(oldKey).Payload)
}

// TestCompactWriteIsFencedOnTheActiveVersion: a compact write compares the
// active-version key in its Txn, so once that key is no longer the one the
// store learned its version from (here: deleted behind its back), the write
// fails instead of storing a format that the namespace's version does not
// say every process reads.
func TestCompactWriteIsFencedOnTheActiveVersion(t *testing.T) {
	ctx := context.Background()
	clock := authority.NewManualClock(testEpoch)
	ns := namespaceAt(t, storeversion.CompactFormat)
	s := newStore(t, nil, etcdstore.Config{Namespace: ns, Clock: clock})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	row := fx.Active(authority.ObjectActor, "a1", conformance.TargetA)
	key := fx.Key(authority.ObjectActor, "a1")
	l := schema.NewLayout(ns)
	before := rawValue(t, l.Row(key))
	_, err := shared.Delete(ctx, l.ActiveVersion())
	require.NoError(t, err)
	res, err := s.CompareExchangeAuthority(ctx, key, row.StoreVersion, authority.Put([]byte("unfenced")))
	if err == nil {
		require.NotEqual(t, authority.KindStored, res.Kind, "a compact write without the active-version key stored")
	} else {
		require.False(t, strings.Contains(err.Error(), "unfenced"))
	}
	require.Equal(t, before, rawValue(t, l.Row(key)), "the row is unchanged")
}
