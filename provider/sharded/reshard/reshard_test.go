package reshard_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"github.com/zlink-systems/authority/provider/sharded"
	"github.com/zlink-systems/authority/provider/sharded/reshard"
)

// grow runs a resharding that adds cs[n] to the map of cs[:n] to its end.
func grow(t testing.TB, cs []etcdstore.Config, n int, edit func(*reshard.Config)) reshard.Progress {
	t.Helper()
	cfg := reshard.Config{Shards: cs[:n], Add: cs[n], LeaseWait: 5 * time.Second, AggregateWait: time.Second}
	if edit != nil {
		edit(&cfg)
	}
	p, err := reshard.Run(context.Background(), cfg)
	require.NoError(t, err, "resharding %d → %d: %v", n, n+1, p)
	require.Equal(t, schema.PhaseDone, p.Phase)
	return p
}

// version is the number a StoreVersion names (the etcd provider's).
func version(t testing.TB, v authority.StoreVersion) int64 {
	t.Helper()
	n, err := strconv.ParseInt(string(v), 10, 64)
	require.NoError(t, err)
	return n
}

// placed checks that every key of a row (the row, its owner index entry,
// its capacity entry) is in exactly one namespace of cs[:n], the one the
// map of n shards places it in, and returns the rows found.
func placed(t testing.TB, cs []etcdstore.Config, n int) map[authority.Key]int {
	t.Helper()
	rows := map[authority.Key]int{}
	index, capacity := map[authority.Key]int{}, map[authority.Key]int{}
	for i, c := range cs[:n] {
		resp, err := c.Client.Get(context.Background(), c.Namespace, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		require.NoError(t, err)
		l := schema.NewLayout(c.Namespace)
		for _, kv := range resp.Kvs {
			kind, row, _ := l.MoveKindOf(string(kv.Key))
			if kind != schema.MoveWithRow {
				continue
			}
			require.Equal(t, sharded.Place(row, n), i, "key %s of row %s is in shard %d of %d", kv.Key, row, i, n)
			seen := []map[authority.Key]int{index}
			switch {
			case strings.HasPrefix(string(kv.Key), l.RowsPrefix()):
				seen = []map[authority.Key]int{rows}
			case strings.Contains(string(kv.Key), "/o/") && strings.HasPrefix(string(kv.Key), c.Namespace+schema.SegCapacity+"/"):
				seen = []map[authority.Key]int{capacity, index} // a placement key: both
			case strings.HasPrefix(string(kv.Key), c.Namespace+schema.SegCapacity+"/"):
				seen = []map[authority.Key]int{capacity}
			}
			for _, m := range seen {
				_, dup := m[row]
				require.False(t, dup, "a key of row %s is in two shards: %s", row, kv.Key)
				m[row] = i
			}
		}
	}
	require.Equal(t, rows, index, "every row has its owner index entry in its shard")
	require.Equal(t, rows, capacity, "every row has its capacity entry in its shard")
	return rows
}

// TestGrowOneToTwoToThree: a namespace of one cluster grows to two, then
// to three, through the job. Every row reads back through the store that
// followed the map (version, payload, owner, object generation, owner
// generation and token kept; the next write's version rises), every key of
// a row is in the
// one shard the map places it in, the owner's lease is held in the new
// clusters, a reservation made before the move commits after it, a commit
// retried across it is alreadyCommitted, and a new owner generation's
// token rises above every earlier one.
func TestGrowOneToTwoToThree(t *testing.T) {
	ctx := context.Background()
	cs := clusters(t)
	s := openStore(t, cs, 1, 1, nil)
	lease, err := s.Registry().Acquire(ctx, conformance.NodeA, 1, "grower", 20*time.Second)
	require.NoError(t, err)
	defer func() { _ = lease.Close(ctx) }()
	fx := conformance.NewFixture(t, harness(s, nil))
	target := conformance.Target(conformance.NodeA, 1, lease.Token())
	before := map[authority.Key]*authority.Snapshot{}
	for i := range 60 {
		kind := authority.ObjectActor
		if i%2 == 1 {
			kind = authority.ObjectUserSpot
		}
		id := fmt.Sprintf("row-%d", i)
		before[fx.Key(kind, id)] = fx.Active(kind, id, target)
	}
	pending := fx.Reserve(authority.ObjectUserSpot, movingID(t, "reserved-across", 1), target)
	committed := fx.Reserve(authority.ObjectUserSpot, movingID(t, "committed-before", 1), target)
	ready := fx.MustCommit(committed, []byte("ready"))
	before[committed.Key] = ready

	where := placed(t, cs, 1)
	clusterID, err := s.ClusterID(ctx)
	require.NoError(t, err)
	for n := 1; n < clusterCount; n++ {
		reg := prometheus.NewRegistry()
		var seen map[string]float64
		p := grow(t, cs, n, func(c *reshard.Config) {
			c.Registerer = reg
			c.Step = func(step string) {
				if strings.HasPrefix(step, "deleting the moved keys") && seen == nil {
					seen = gathered(t, reg)
				}
			}
		})
		require.Positive(t, seen["authority_reshard_rows_copied_total"], "metrics while the job runs: %v", seen)
		require.Positive(t, seen["authority_reshard_keys_copied_total"])
		require.Equal(t, 1.0, seen["authority_reshard_phase{phase=switched}"])
		require.Equal(t, 0.0, seen["authority_reshard_phase{phase=copying}"])
		require.Positive(t, p.Rows, "no row moved from %d to %d shards", n, n+1)
		require.NoError(t, s.MarkLive(ctx, conformance.NodeB, 1, conformance.OwnerB, time.Minute)) // routes once: follows the map
		require.Equal(t, n+1, s.Shards())
		require.Equal(t, int64(n+1), s.Map().Epoch)
		id, err := s.ClusterID(ctx)
		require.NoError(t, err)
		require.Equal(t, clusterID, id, "a growth keeps the ClusterID fence tables follow")
		rows := placed(t, cs, n+1)
		require.Len(t, rows, len(before)+1)
		moved := 0
		for key, b := range before {
			got := fx.MustRow(key)
			require.Equal(t, b.Payload, got.Payload, "row %s", key)
			require.Equal(t, b.Owner(), got.Owner())
			require.Equal(t, b.StoreVersion, got.StoreVersion, "row %s keeps its version: the copy is the same state", key)
			require.Equal(t, b.ObjectGeneration, got.ObjectGeneration, "row %s keeps its object generation", key)
			require.Equal(t, b.AuthorityOwnerGeneration, got.AuthorityOwnerGeneration)
			require.Equal(t, b.OwnershipToken, got.OwnershipToken, "row %s keeps its token", key)
			if rows[key] != where[key] {
				moved++
				require.Equal(t, n, rows[key], "row %s moved to the new shard", key)
			}
		}
		require.Positive(t, moved)
		where = rows
		// the owner is live in every shard: a write of each row applies
		for key, b := range before {
			res, err := s.CompareExchangeAuthority(ctx, key, b.StoreVersion, authority.Put([]byte(fmt.Sprintf("after %d", n))))
			require.NoError(t, err)
			require.Equal(t, authority.KindStored, res.Kind, "row %s", key)
			require.Equal(t, b.OwnershipToken, res.Snapshot.OwnershipToken)
			require.Greater(t, version(t, res.Snapshot.StoreVersion), version(t, b.StoreVersion), "row %s: versions rise", key)
			before[key] = res.Snapshot
		}
		// a commit retried across the move is answered as already done
		res, err := s.Commit(ctx, committed.CommitRequest([]byte("ready")))
		require.NoError(t, err)
		require.Equal(t, authority.KindAlreadyCommitted, res.Kind)
	}
	done := fx.MustCommit(pending, []byte("committed after two moves"))
	require.Equal(t, pending.Res.Creating.ObjectGeneration, done.ObjectGeneration)

	// a new lease generation rebinds every row; each token rises above
	// every earlier one
	next, err := s.Registry().Acquire(ctx, conformance.NodeA, 1, "grower", 20*time.Second)
	require.NoError(t, err)
	defer func() { _ = next.Close(ctx) }()
	n, err := next.RebindRows(ctx, lease.Token())
	require.NoError(t, err)
	require.Equal(t, int64(len(before)+1), n)
	for key, b := range before {
		got := fx.MustRow(key)
		require.Equal(t, next.Token(), got.Owner())
		require.Greater(t, got.OwnershipToken, b.OwnershipToken, "row %s", key)
	}
	// a store opened on the map of three shards reads them all
	fresh := openStore(t, cs, clusterCount, clusterCount, nil)
	ffx := conformance.NewFixture(t, harness(fresh, nil))
	for key := range before {
		require.Equal(t, next.Token(), ffx.MustRow(key).Owner())
	}
	require.Len(t, ffx.ListAll("", 7), len(before)+1)
}

// movingID returns a user spot ID starting with prefix whose row moves when
// the map grows from n shards to n+1.
func movingID(t testing.TB, prefix string, n int) string {
	t.Helper()
	for i := range 10000 {
		id := fmt.Sprintf("%s-%d", prefix, i)
		key, err := authority.EncodeKey(authority.ObjectUserSpot, id)
		require.NoError(t, err)
		if sharded.Place(key, n+1) == n {
			return id
		}
	}
	t.Fatalf("no moving ID for %s", prefix)
	return ""
}

// gathered returns every metric of reg, by name (and labels).
func gathered(t testing.TB, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			for _, l := range m.GetLabel() {
				name += "{" + l.GetName() + "=" + l.GetValue() + "}"
			}
			switch {
			case m.GetCounter() != nil:
				out[name] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				out[name] = m.GetGauge().GetValue()
			}
		}
	}
	return out
}
