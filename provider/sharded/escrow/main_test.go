package escrow_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	"github.com/zlink-systems/authority/internal/testkit/shardtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/sharded/escrow"
)

// servers are the clusters every test of the package shares: three
// embedded etcd servers, one per shard (each test works in its own
// namespace on each).
var servers []*etcdtest.Server

// shardCount is how many clusters the tests spread a namespace over.
const shardCount = 3

func TestMain(m *testing.M) {
	if etcdtest.External() {
		// one external cluster cannot be three shards
		fmt.Fprintln(os.Stderr, "escrow tests need embedded etcd servers; skipped on an external cluster")
		os.Exit(0)
	}
	os.Exit(shardtest.Main(m, shardCount, func(c *shardtest.Clusters) { servers = c.Servers }, goleak.Find))
}

// liveTTL is how long the test owners stay live without renewal.
const liveTTL = 5 * time.Minute

var (
	node   = conformance.NodeA
	target = conformance.TargetA
	// lifecycle is the node lifecycle the tests place on.
	lifecycle = conformance.NodeLifecycle
)

// shardSet is one namespace over the shard servers: a store per shard in
// escrow mode and the mover they share.
type shardSet struct {
	ns     string
	stores []*etcdstore.Store
	mover  *escrow.Mover
}

// setOptions configure openShards.
type setOptions struct {
	policy authority.CapacityPolicy
	chunk  int64
	// wrap, when set, wraps shard i's steps as the mover sees them.
	wrap func(i int, sh escrow.Shard) escrow.Shard
	// clock and claims are every store's (nil: the wall clock, none).
	clock  authority.Clock
	claims authority.IdentityClaims
}

// openShards opens a store per shard on namespace ns (a new one when ""),
// with its own mover, and marks the target owner live in every shard.
func openShards(t testing.TB, ns string, o setOptions) *shardSet {
	t.Helper()
	if ns == "" {
		ns = etcdtest.Namespace()
	}
	m, err := escrow.New(escrow.Config{Shards: shardCount, Chunk: o.chunk})
	require.NoError(t, err)
	set := &shardSet{ns: ns, mover: m}
	for i, srv := range servers {
		c := srv.Client(t)
		s, err := etcdstore.New(context.Background(), etcdstore.Config{Client: c, Namespace: ns,
			CapacityPolicy: o.policy, CapacityEscrow: m.Hook(i), SkipVersionCheck: true, Clock: o.clock, IdentityClaims: o.claims})
		require.NoError(t, err)
		t.Cleanup(func() {
			_ = s.Close()
			_, _ = c.Delete(context.Background(), ns, clientv3.WithPrefix())
		})
		var sh escrow.Shard = s.Budget()
		if o.wrap != nil {
			sh = o.wrap(i, sh)
		}
		require.NoError(t, m.Attach(i, sh))
		require.NoError(t, s.MarkLive(context.Background(), target.Descriptor(), target.NodeLifecycleGeneration, target.Owner, liveTTL))
		set.stores = append(set.stores, s)
	}
	return set
}

var requestSeq atomic.Int64

// reserveRequest is a valid reservation of kind/id on the target.
func reserveRequest(kind authority.ObjectKind, id string) authority.ReserveRequest {
	ref := fmt.Sprintf("content-%d", requestSeq.Add(1))
	sum := sha256.Sum256([]byte(ref))
	return authority.ReserveRequest{
		Key: authority.ObjectKey{Kind: kind, GlobalID: id},
		Intent: authority.CreationIntent{StableType: conformance.DefaultStableType, RequestContentReference: ref,
			RequestSHA256: sum[:], RequestEncodedSize: int64(len(ref))},
		Target:          target,
		CreatingPayload: []byte("creating " + id),
		Capacity:        conformance.Capacity(kind, conformance.DefaultStableType),
	}
}

// usage sums one counter of the target node over every shard.
func (set *shardSet) usage(t testing.TB, kind authority.ObjectKind) (active, reserved int64) {
	t.Helper()
	for _, s := range set.stores {
		u, err := s.CapacityUsage(context.Background(), node, lifecycle, kind, conformance.DefaultStableType)
		require.NoError(t, err)
		active, reserved = active+u.Active, reserved+u.Reserved
	}
	return active, reserved
}

// requireSettled checks that no budget of the target node lifecycle is in
// flight: every shard received what the ledger gave it and the ledger took
// back what every slice returned. With reclaimed set it also checks that
// no slice holds slack: the ledger's Granted is the usage over all shards.
func (set *shardSet) requireSettled(t testing.TB, reclaimed bool) {
	t.Helper()
	ctx := context.Background()
	home := escrow.HomeShard(node, shardCount)
	led, err := set.stores[home].Budget().Ledger(ctx, node, lifecycle)
	require.NoError(t, err)
	total := map[string]int64{}
	for i, s := range set.stores {
		st, err := s.Budget().Slice(ctx, node, lifecycle)
		require.NoError(t, err)
		line := led.Shards[i]
		require.Equal(t, budgetOrEmpty(line.Given), budgetOrEmpty(st.Slice.Received), "shard %d received what the ledger gave it", i)
		require.Equal(t, budgetOrEmpty(line.Taken), budgetOrEmpty(st.Slice.Returned), "the ledger took back what shard %d returned", i)
		require.True(t, st.Slice.Size().Covers(st.Usage), "shard %d: usage %v within its slice %v", i, st.Usage, st.Slice.Size())
		if reclaimed {
			require.Equal(t, budgetOrEmpty(st.Usage), budgetOrEmpty(st.Slice.Size()), "shard %d holds no slack", i)
		}
		for c, n := range st.Usage {
			total[fmt.Sprint(c)] += n
		}
	}
	if reclaimed {
		granted := map[string]int64{}
		for c, n := range led.Granted() {
			granted[fmt.Sprint(c)] = n
		}
		require.Equal(t, total, granted, "the ledger grants exactly the usage over all shards")
	}
}

func budgetOrEmpty[M ~map[K]V, K comparable, V any](m M) M {
	if m == nil {
		return M{}
	}
	return m
}
