package etcd_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/preflight"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// envExpectRefusal, when set, says the cluster under test is older than
// preflight.MinServerVersion (.ci/run sets it after comparing versions):
// TestDialWithEnvironmentSettings then checks the refusal instead.
const envExpectRefusal = "AUTHORITY_ETCD_EXPECT_REFUSAL"

// TestDialWithEnvironmentSettings lets the store dial the test cluster
// itself, with the endpoints, TLS files and credentials of the environment
// (none for the embedded server), checks the server version and reserves,
// reads and removes a row: the provider's own connection code works against
// the cluster under test. (Nothing here takes a record lease: the store's
// own client is not one whose leases etcdtest revokes.)
func TestDialWithEnvironmentSettings(t *testing.T) {
	ctx := context.Background()
	clock := authority.NewManualClock(testEpoch)
	ns := etcdtest.Namespace()
	s, err := etcdstore.New(ctx, etcdstore.Config{
		Endpoints: server.Endpoints(),
		CAFile:    os.Getenv(etcdtest.EnvCACert), CertFile: os.Getenv(etcdtest.EnvCert), KeyFile: os.Getenv(etcdtest.EnvKey),
		Username: os.Getenv(etcdtest.EnvUser), Password: os.Getenv(etcdtest.EnvPassword),
		Namespace: ns, Clock: clock,
	})
	if os.Getenv(envExpectRefusal) != "" {
		// the cluster is known to be too old: the store must refuse it
		require.ErrorIs(t, err, authority.ErrUnsupportedServer)
		require.ErrorContains(t, err, "minimum supported version "+preflight.MinServerVersion)
		t.Logf("refused as expected: %v", err)
		return
	}
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = s.Close()
		_, _ = shared.Delete(ctx, ns, clientv3.WithPrefix())
	})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	r := fx.Reserve(authority.ObjectActor, "dialled", conformance.TargetA)
	require.NotNil(t, fx.MustRow(r.Key).PendingCreation)
	n, err := s.RemoveAllByOwner(ctx, conformance.TargetA.Owner)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	fx.RequireMissing(r.Key)
}

// A reservation retention its leases could not honour is refused.
func TestNewRefusesRetentionPastMaxRetention(t *testing.T) {
	_, err := etcdstore.New(context.Background(), etcdstore.Config{
		Client: server.Client(t), Namespace: "/retention-test/", ReservationRetention: authority.MaxRetention + time.Second,
	})
	require.ErrorIs(t, err, authority.ErrInvalidArgument)
}
