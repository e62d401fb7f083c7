package etcd

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/provider/etcd/schema"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestUsageWatchApply: the watch adds created entries, moves rewritten ones
// by their previous value, takes out deleted ones, skips what it applied
// already, and fails on a change whose previous value etcd did not give.
func TestUsageWatchApply(t *testing.T) {
	node := authority.NodeDescriptor{MeshName: "m", RID: "r"}
	prefix := schema.NewLayout("/ns/").CapacityNode(node, 1)
	ws := &usageWatches{m: map[string]*usageWatch{}}
	w := &usageWatch{node: node, lifecycle: 1, at: 5, changed: make(chan struct{}),
		usage: nodeUsage{reserved: map[authority.CapacityCounter]int64{}, active: map[authority.CapacityCounter]int64{}}}
	ws.m[prefix] = w
	actor := authority.UsageCounter(node, 1, authority.ObjectActor, "")
	kv := func(key string, st authority.AllocationState, create, mod int64) *mvccpb.KeyValue {
		return &mvccpb.KeyValue{Key: []byte(prefix + key), Value: []byte(schema.EncodeCapacityEntry(st, authority.CapacityVector{Actors: 2})),
			CreateRevision: create, ModRevision: mod}
	}
	reservedA := kv("row/actor/a", authority.AllocationReserved, 6, 6)
	activeA := kv("row/actor/a", authority.AllocationActive, 6, 7)
	events := []*clientv3.Event{
		{Type: mvccpb.PUT, Kv: kv("row/actor/old", authority.AllocationReserved, 4, 4)}, // applied already
		{Type: mvccpb.PUT, Kv: reservedA},
	}
	require.NoError(t, ws.apply(prefix, w, events))
	require.EqualValues(t, 2, w.usage.reserved[actor])
	require.EqualValues(t, 6, w.at)
	changed := w.changed
	require.NoError(t, ws.apply(prefix, w, []*clientv3.Event{{Type: mvccpb.PUT, Kv: activeA, PrevKv: reservedA}}))
	require.EqualValues(t, 0, w.usage.reserved[actor])
	require.EqualValues(t, 2, w.usage.active[actor])
	require.EqualValues(t, 7, w.at)
	select {
	case <-changed:
	default:
		t.Fatal("waiters not woken")
	}
	require.NoError(t, ws.apply(prefix, w, []*clientv3.Event{{Type: mvccpb.DELETE, Kv: &mvccpb.KeyValue{Key: activeA.Key, ModRevision: 8}, PrevKv: activeA}}))
	require.EqualValues(t, 0, w.usage.active[actor])
	require.EqualValues(t, 8, w.at)
	// a rewrite or delete without its previous value cannot be summed, an
	// entry that is no capacity entry is corrupt: the watch fails at once,
	// even when part of the response was applied
	fresh := func() *usageWatch {
		return &usageWatch{node: node, lifecycle: 1, at: 8, changed: make(chan struct{}),
			usage: nodeUsage{reserved: map[authority.CapacityCounter]int64{}, active: map[authority.CapacityCounter]int64{}}}
	}
	created := &clientv3.Event{Type: mvccpb.PUT, Kv: kv("row/actor/c", authority.AllocationReserved, 9, 9)}
	for _, c := range []struct {
		name string
		ev   *clientv3.Event
		want error
	}{
		{"rewrite", &clientv3.Event{Type: mvccpb.PUT, Kv: kv("row/actor/b", authority.AllocationActive, 3, 9)}, errNoPrevKV},
		{"delete", &clientv3.Event{Type: mvccpb.DELETE, Kv: &mvccpb.KeyValue{Key: activeA.Key, ModRevision: 9}}, errNoPrevKV},
		{"foreign", &clientv3.Event{Type: mvccpb.PUT, Kv: &mvccpb.KeyValue{Key: []byte(prefix + "x"), CreateRevision: 9, ModRevision: 9}}, authority.ErrCorrupt},
	} {
		w := fresh()
		ws.m[prefix] = w
		require.ErrorIs(t, ws.apply(prefix, w, []*clientv3.Event{created, c.ev}), c.want, c.name)
		require.True(t, w.broken, c.name)
		_, ok := ws.wait(context.Background(), prefix, 8)
		require.False(t, ok, "%s: a failed watch's usage is not used", c.name)
	}
}
