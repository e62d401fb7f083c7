package etcd_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// foreignKeys sit around the test namespaces ("/etcdtest/<hex>/") and the
// default namespace, sharing prefixes with them.
var foreignKeys = []string{
	"/etcdtest", "/etcdtest0", "/etcdtest/", "/etcdtest/0000000000000000",
	"/etcdtest/ffffffffffffffff0/rows/actor/x", "/etcdtesu/rows/actor/x",
	"/zlink/authority/v1/rows/actor/x", "/zlink/authority/v1", "rows/actor/x", "\xff",
}

func TestForeignKeysUntouched(t *testing.T) {
	etcdtest.SkipIfExternal(t, externalForeignKeys)
	ctx := context.Background()
	for i, k := range foreignKeys {
		_, err := shared.Put(ctx, k, fmt.Sprintf("foreign-%d", i))
		require.NoError(t, err)
	}
	before := map[string]int64{}
	for _, k := range foreignKeys {
		resp, err := shared.Get(ctx, k)
		require.NoError(t, err)
		require.Len(t, resp.Kvs, 1)
		before[k] = resp.Kvs[0].ModRevision
	}
	t.Run("Conformance", func(t *testing.T) { conformance.RunAll(t.Context(), t, etcdFactory) })
	for i, k := range foreignKeys {
		resp, err := shared.Get(ctx, k)
		require.NoError(t, err)
		require.Len(t, resp.Kvs, 1, "foreign key %q gone", k)
		require.Equal(t, fmt.Sprintf("foreign-%d", i), string(resp.Kvs[0].Value))
		require.Equal(t, before[k], resp.Kvs[0].ModRevision, "foreign key %q rewritten", k)
		_, err = shared.Delete(ctx, k)
		require.NoError(t, err)
	}
	// nothing of the tests' namespaces is left either
	resp, err := shared.Get(ctx, "/etcdtest/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	require.NoError(t, err)
	var left []string
	for _, kv := range resp.Kvs {
		left = append(left, string(kv.Key))
	}
	require.Empty(t, left)
}

func TestScanSurvivesConcurrentWritesThenExpires(t *testing.T) {
	h := etcdFactory(t)
	fx := conformance.NewFixture(t, h)
	st := fx.Store()
	ctx := fx.Ctx()
	want := map[authority.Key]authority.StoreVersion{}
	for i := 0; i < 60; i++ {
		snap := fx.Active(authority.ObjectActor, fmt.Sprintf("k%02d", i), conformance.TargetA)
		want[fx.Key(authority.ObjectActor, fmt.Sprintf("k%02d", i))] = snap.StoreVersion
	}
	prefix := authority.KindPrefix(authority.ObjectActor)
	page, err := st.ListAuthorities(ctx, prefix, "", 7)
	require.NoError(t, err)
	require.Equal(t, authority.KindPage, page.Kind)
	got := map[authority.Key]authority.StoreVersion{}
	for _, it := range page.Items {
		got[it.Key] = it.Snapshot.StoreVersion
	}

	// writers change, delete and add rows while the listing pages on
	var wg sync.WaitGroup
	wg.Add(2)
	errs := make(chan error, 2)
	go func() {
		defer wg.Done()
		for i := 0; i < 60; i += 2 {
			key := authority.Key(fmt.Sprintf("actor/k%02d", i))
			res, err := st.CompareExchangeAuthority(ctx, key, want[key], authority.Put([]byte("changed")))
			if err != nil || res.Kind != authority.KindStored {
				errs <- fmt.Errorf("put %s: %v %v", key, res.Kind, err)
				return
			}
		}
	}()
	go func() {
		defer wg.Done()
		for i := 1; i < 60; i += 4 {
			key := authority.Key(fmt.Sprintf("actor/k%02d", i))
			res, err := st.CompareExchangeAuthority(ctx, key, want[key], authority.Delete())
			if err != nil || res.Kind != authority.KindDeleted {
				errs <- fmt.Errorf("delete %s: %v %v", key, res.Kind, err)
				return
			}
		}
	}()
	cursor := page.NextCursor
	for cursor != "" {
		page, err = st.ListAuthorities(ctx, prefix, cursor, 7)
		require.NoError(t, err)
		require.Equal(t, authority.KindPage, page.Kind)
		for _, it := range page.Items {
			got[it.Key] = it.Snapshot.StoreVersion
		}
		cursor = page.NextCursor
		if len(got) == 28 { // mid-listing, wait for the writers once
			wg.Wait()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, want, got, "the listing is the snapshot of its first page")

	// a cursor of another prefix or a garbled one is invalid
	fresh, err := st.ListAuthorities(ctx, prefix, "", 7)
	require.NoError(t, err)
	_, err = st.ListAuthorities(ctx, authority.KindPrefix(authority.ObjectUserSpot), fresh.NextCursor, 7)
	require.ErrorIs(t, err, authority.ErrInvalidArgument)
	_, err = st.ListAuthorities(ctx, prefix, fresh.NextCursor+"x", 7)
	require.ErrorIs(t, err, authority.ErrInvalidArgument)

	// a compaction past the listing's revision expires its cursor (skipped
	// on an external cluster)
	page, err = st.ListAuthorities(ctx, prefix, "", 7)
	require.NoError(t, err)
	compactNow(t)
	page, err = st.ListAuthorities(ctx, prefix, page.NextCursor, 7)
	require.NoError(t, err)
	require.Equal(t, authority.KindScanExpired, page.Kind)
}

// No store opens inside another store's key layout: a namespace with a
// layout segment as one of its path segments is refused, so the store on
// ns can never read, list or overwrite the rows of a store on ns+"rows/".
func TestNamespaceInsideAnotherLayoutIsRefused(t *testing.T) {
	outer := etcdtest.Namespace()
	for _, seg := range []string{"rows", "owners", "owner-gens", "owner-rows", "capacity", "capacity-epochs",
		"reservations", "terminals", "aggregates", "blobs", "store-version"} {
		for _, ns := range []string{outer + seg + "/", outer + seg + "/actor/", "/" + seg + "/", seg + "/x/"} {
			_, err := etcdstore.New(context.Background(), etcdstore.Config{Client: shared, Namespace: ns})
			require.ErrorIs(t, err, authority.ErrInvalidArgument, "namespace %q", ns)
			require.ErrorContains(t, err, seg)
		}
	}
	// names that merely start like a segment lie outside every layout
	for _, ns := range []string{outer + "rowsx/", outer + "my-rows/", outer + "tenant/"} {
		s, err := etcdstore.New(context.Background(), etcdstore.Config{Client: shared, Namespace: ns})
		require.NoError(t, err, "namespace %q", ns)
		require.NoError(t, s.Close())
		_, err = shared.Delete(context.Background(), ns, clientv3.WithPrefix())
		require.NoError(t, err)
	}
}

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
		e, err := schema.DecodeEntry(outer.Namespace(), kv)
		require.NoError(t, err, "key %q", kv.Key)
		if strings.HasPrefix(string(kv.Key), outer.Namespace()+schema.SegStoreVersion+"/") {
			// the outer store's own version and announcement
			require.Equal(t, schema.EntryStoreVersion, e.Kind, "key %q", kv.Key)
			continue
		}
		require.Equal(t, schema.EntryUnknown, e.Kind, "key %q", kv.Key)
	}
}
