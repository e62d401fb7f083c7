package faults_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.uber.org/zap"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/embedded"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The cluster runs out of its backend quota under traffic (NOSPACE alarm):
// rows rewritten with large payloads fill it with history, as a cluster
// without auto-compaction fills. Writes answer a typed error, nothing
// acknowledged is lost, reads work, and once the operator compacts,
// defragments and disarms the alarm the same store writes again, and
// RemoveAllByOwner frees the rows, without a restart.
func TestQuotaExhausted(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := embedded.Start(ctx, embedded.Config{ClientAddr: freeAddr(t), AutoCompactionRetention: "0", QuotaBackendBytes: 8 << 20})
	require.NoError(t, err)
	defer srv.Close()
	s, fx := embeddedStore(t, srv.Endpoint(), "/quota/")
	owner := authority.OwnerToken{OwnerID: "filler", LeaseGeneration: 1}
	target := conformance.Target(conformance.NodeA, conformance.NodeLifecycle, owner)
	fx.SetLive(target, true)
	const rows = 4
	keys := make([]authority.Key, rows)
	versions := make([]authority.StoreVersion, rows)
	acked := make([][]byte, rows) // the last acknowledged payload of each row
	for i := range keys {
		id := fmt.Sprintf("spot-%d", i)
		versions[i] = fx.Active(authority.ObjectUserSpot, id, target).StoreVersion
		keys[i] = fx.Key(authority.ObjectUserSpot, id)
	}
	writes, typed := 0, 0
	for n := 0; n < 400 && typed < 5; n++ {
		i := n % rows
		payload := bytes.Repeat([]byte{byte(n)}, 256<<10)
		res, err := s.CompareExchangeAuthority(ctx, keys[i], versions[i], authority.Put(payload))
		switch {
		case err == nil && res.Kind == authority.KindStored:
			versions[i], acked[i] = res.Snapshot.StoreVersion, payload
			writes++
		case err != nil:
			require.True(t, errors.Is(err, authority.ErrOutcomeUnknown) || errors.Is(err, authority.ErrUnavailable),
				"a write over quota answers a typed error, not %v", err)
			typed++
			// an unknown outcome may have applied: go on from what is stored
			read, rerr := s.ReadAuthority(ctx, keys[i])
			require.NoError(t, rerr, "reads work under the alarm")
			versions[i] = read.Snapshot.StoreVersion
			if !bytes.Equal(read.Snapshot.Payload, acked[i]) {
				acked[i] = read.Snapshot.Payload
			}
		default:
			t.Fatalf("row %d: %s", i, res.Kind)
		}
	}
	require.Positive(t, typed, "the quota was never reached")
	raw, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint()}, Logger: zap.NewNop()})
	require.NoError(t, err)
	defer raw.Close()
	alarms, err := raw.AlarmList(ctx)
	require.NoError(t, err)
	require.NotEmpty(t, alarms.Alarms, "no NOSPACE alarm")
	lost := 0
	for i, k := range keys { // nothing acknowledged is lost
		read, err := s.ReadAuthority(ctx, k)
		require.NoError(t, err)
		if read.Snapshot == nil || !bytes.Equal(read.Snapshot.Payload, acked[i]) {
			lost++
		}
	}
	before, err := raw.Status(ctx, srv.Endpoint())
	require.NoError(t, err)
	// the operator's procedure: compact, defragment, disarm
	compactDefrag(ctx, t, raw, srv.Endpoint())
	_, err = raw.AlarmDisarm(ctx, &clientv3.AlarmMember{MemberID: alarms.Alarms[0].MemberID, Alarm: etcdserverpb.AlarmType_NOSPACE})
	require.NoError(t, err)
	after, err := raw.Status(ctx, srv.Endpoint())
	require.NoError(t, err)
	// the same store writes again, and frees the rows
	res, err := s.CompareExchangeAuthority(ctx, keys[0], versions[0], authority.Put([]byte("after recovery")))
	require.NoError(t, err, "the store writes again once the alarm is disarmed")
	require.Equal(t, authority.KindStored, res.Kind)
	removed, err := s.RemoveAllByOwner(ctx, owner)
	require.NoError(t, err)
	t.Logf("quota: writes=%d acked-lost=%d typed-errors=%d db-bytes %d -> %d after compact+defrag removed=%d recovered=true",
		writes, lost, typed, before.DbSize, after.DbSize, removed)
	require.Zero(t, lost)
	require.Equal(t, int64(rows), removed)
}
