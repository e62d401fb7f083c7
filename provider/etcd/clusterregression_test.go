package etcd_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
)

const externalRegression = "the test moves a store's client from one embedded server to another"

// rewoundCluster is a store that worked on server old, whose client now
// reaches server rewound: a cluster restored from a backup taken before the
// store's last writes (both embedded servers have the same cluster ID, as a
// cluster restored with its original token does).
type rewoundCluster struct {
	cli     *clientv3.Client
	rewound *etcdtest.Server
	store   *etcdstore.Store
	fx      *conformance.Fixture
	key     authority.Key
	held    authority.StoreVersion // the row version a caller holds from before the restore
	lease   *etcdstore.OwnerLease
}

// rewind builds a rewoundCluster: on old, an owner lease writes a row twice
// (the caller holds the second version, V) and the cluster moves on; rewound
// holds the namespace as it was before the second write, with the row
// written again, differently, at exactly revision V, so that a compare on V
// holds there for another row state.
func rewind(t *testing.T) *rewoundCluster {
	t.Helper()
	etcdtest.SkipIfExternal(t, externalRegression)
	ctx := context.Background()
	old, rewound := etcdtest.Start(t), etcdtest.Start(t)
	cli, err := clientv3.New(old.Config())
	require.NoError(t, err)
	t.Cleanup(func() { _ = cli.Close() })
	clock := authority.NewManualClock(testEpoch)
	ns := etcdtest.Namespace()
	s, err := etcdstore.New(ctx, etcdstore.Config{Client: cli, Namespace: ns, Clock: clock})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	lease, err := s.Registry().Acquire(ctx, conformance.NodeA, conformance.NodeLifecycle, "restored", time.Minute)
	require.NoError(t, err)
	t.Cleanup(func() { _ = lease.Close(context.Background()) })
	tgt := conformance.Target(conformance.NodeA, conformance.NodeLifecycle, lease.Token())
	key := fx.Key(authority.ObjectUserSpot, "row")
	for range 40 { // history before the backup, so the restored keys fit under V
		_, err := cli.Put(ctx, "history", "x")
		require.NoError(t, err)
	}
	first := fx.Active(authority.ObjectUserSpot, "row", tgt)

	backup, err := cli.Get(ctx, ns, clientv3.WithPrefix()) // the namespace at the backup
	require.NoError(t, err)
	held := fx.Put(key, first.StoreVersion, []byte("after the backup")).StoreVersion
	for i := range 5 { // the cluster moves on, and the store sees it
		_, err := cli.Put(ctx, ns+"elsewhere/"+strconv.Itoa(i), "x")
		require.NoError(t, err)
	}
	fx.Read(key)

	// the restored cluster: the backup's keys, then the row rewritten at V
	heldRev, err := strconv.ParseInt(string(held), 10, 64)
	require.NoError(t, err)
	rcli := rewound.Client(t)
	rowKey := ns + "rows/" + string(key)
	var row []byte
	for _, kv := range backup.Kvs {
		if string(kv.Key) == rowKey {
			row = kv.Value
			continue
		}
		_, err := rcli.Put(ctx, string(kv.Key), string(kv.Value)) // leases are not copied: keys stay
		require.NoError(t, err)
	}
	require.NotNil(t, row, "row key %q not in the backup", rowKey)
	for {
		st, err := rcli.Get(ctx, "pad")
		require.NoError(t, err)
		if st.Header.Revision >= heldRev-1 {
			require.Equal(t, heldRev-1, st.Header.Revision, "the backup has more revisions than the store saw")
			break
		}
		_, err = rcli.Put(ctx, "pad", "x")
		require.NoError(t, err)
	}
	put, err := rcli.Put(ctx, rowKey, string(row))
	require.NoError(t, err)
	require.Equal(t, heldRev, put.Header.Revision)

	// the old cluster stops; the client reaches the restored one
	old.Close()
	cli.SetEndpoints(rewound.Endpoint())
	return &rewoundCluster{cli: cli, rewound: rewound, store: s, fx: fx, key: key, held: held, lease: lease}
}

// rowRevision reads the row's ModRevision on the restored cluster directly.
func (r *rewoundCluster) rowRevision(t *testing.T) int64 {
	t.Helper()
	resp, err := r.rewound.Client(t).Get(context.Background(), r.store.Namespace()+"rows/"+string(r.key))
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	return resp.Kvs[0].ModRevision
}

func requireRegressed(t *testing.T, err error, sentinel error) {
	t.Helper()
	require.Error(t, err)
	require.ErrorIs(t, err, etcdstore.ErrClusterRegressed)
	require.ErrorIs(t, err, sentinel)
}

// A compare on a row version read before the restore would hold in the
// restored cluster for another row state: the store must not send it.
func TestClusterRegressionRefusesStaleCompare(t *testing.T) {
	r := rewind(t)
	ctx := context.Background()
	before := r.rowRevision(t)

	res, err := r.store.CompareExchangeAuthority(ctx, r.key, r.held, authority.Put([]byte("stale")))
	requireRegressed(t, err, authority.ErrUnavailable)
	require.Equal(t, authority.CompareExchangeResult{}, res)
	require.Equal(t, before, r.rowRevision(t), "the stale compare-and-swap was applied")

	// every request is refused from now on, nothing sent; the owner lease ends
	_, err = r.store.ReadAuthority(ctx, r.key)
	requireRegressed(t, err, authority.ErrUnavailable)
	_, err = r.store.CompareExchangeAuthority(ctx, r.key, r.held, authority.Delete())
	requireRegressed(t, err, authority.ErrUnavailable)
	select {
	case <-r.lease.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the owner lease granted before the restore is still held")
	}
	require.Equal(t, before, r.rowRevision(t))

	// a new store on the same client works on the restored cluster
	s2, err := etcdstore.New(ctx, etcdstore.Config{Client: r.cli, Namespace: r.store.Namespace()})
	require.NoError(t, err)
	defer s2.Close()
	got, err := s2.ReadAuthority(ctx, r.key)
	require.NoError(t, err)
	require.Equal(t, authority.KindSnapshot, got.Kind)
	require.Equal(t, strconv.FormatInt(before, 10), string(got.Snapshot.StoreVersion))
}

// A read answered by the restored cluster shows the regression in its
// response; it is refused, and so is every later write.
func TestClusterRegressionSeenByRead(t *testing.T) {
	r := rewind(t)
	ctx := context.Background()
	_, err := r.store.ReadAuthority(ctx, r.key)
	requireRegressed(t, err, authority.ErrUnavailable)
	require.False(t, errors.Is(err, authority.ErrOutcomeUnknown))
	_, err = r.store.CompareExchangeAuthority(ctx, r.key, r.held, authority.Put([]byte("stale")))
	requireRegressed(t, err, authority.ErrUnavailable)
	_, err = r.store.Registry().Acquire(ctx, conformance.NodeA, conformance.NodeLifecycle, "after", time.Minute)
	requireRegressed(t, err, authority.ErrUnavailable)
}
