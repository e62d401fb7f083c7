package schema

import (
	"encoding/json"
	"fmt"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

// SegShardMap is the layout segment of the shard map: the etcd clusters a
// store over several clusters (package provider/sharded) spreads its rows
// over. Every shard's namespace holds the same map; a namespace without one
// is the one-shard case (a single-cluster store's namespace).
const SegShardMap = "shard-map"

// ShardMap is the key of the namespace's shard map.
func (l Layout) ShardMap() string { return l.ns + SegShardMap + "/current" }

// MaxShards is the most shards a shard map may list.
const MaxShards = 256

// ShardMap is the value of the shard-map key: the clusters, in order (a
// row's shard is an index into Shards), the hash that places a key, and the
// map's epoch (a resharding moves it on).
type ShardMap struct {
	// Epoch is the map's version: ≥ 1.
	Epoch int64
	// Hash names the function from an authority key to a shard index.
	Hash string
	// Shards are the clusters, in the map's order.
	Shards []ShardMapShard
	// HomeShards is the shard count whose hash places what must not move
	// when the map grows: a cross-shard aggregate's coordinator record and
	// a node's capacity escrow ledger (their home shards among the first
	// HomeShards shards). A resharding sets it once and keeps it: to the
	// shard count of a map created with several shards, or to 1 when it
	// grows a one-shard map (whose records and ledgers are all in that
	// cluster, and stay there); 0 (a map no resharding wrote) stands for
	// len(Shards). Homes returns it.
	HomeShards int
	// Raw says that every shard numbers its rows with its cluster's
	// revisions unchanged (package provider/sharded, rowversion.go): a
	// namespace that grew from one cluster keeps the numbers that cluster
	// gave, and a row moved by any growth keeps its own. A resharding sets
	// it when it grows a one-shard map and keeps it; false (a map created
	// with several shards) numbers rows revision × 1024 + shard.
	Raw bool
}

// NextRaw returns the Raw of the map that grows m by one shard.
func (m ShardMap) NextRaw() bool { return m.Raw || len(m.Shards) == 1 }

// Homes returns the shard count that places home shards (HomeShards).
func (m ShardMap) Homes() int {
	if m.HomeShards > 0 {
		return m.HomeShards
	}
	return len(m.Shards)
}

// NextHomes returns the HomeShards of the map that grows m by one shard:
// m's home shard count, which is 1 for a map of one shard, so nothing
// placed by it ever moves.
func (m ShardMap) NextHomes() int { return m.Homes() }

// ShardMapShard is one shard of a map: the etcd cluster (its cluster ID, as
// etcdctl prints it) and the namespace the shard's keys live under.
type ShardMapShard struct {
	ClusterID string
	Namespace string
}

type shardMapWire struct {
	E int64       `json:"e"`
	H string      `json:"h"`
	S []shardWire `json:"s"`
	K int         `json:"k,omitempty"` // HomeShards
	U bool        `json:"u,omitempty"` // Raw
}

type shardWire struct {
	C string `json:"c"`
	N string `json:"n"`
}

// Encode returns the stored value of m (a JSON object).
func (m ShardMap) Encode() string {
	b, _ := json.Marshal(m.wire())
	return string(b)
}

// Check reports what makes m unstorable: an epoch below 1, a hash or cluster
// ID that is not text, no shard or more than MaxShards, a namespace
// ValidateNamespace refuses, or one cluster and namespace listed twice.
func (m ShardMap) Check() error {
	if m.Epoch < 1 {
		return fmt.Errorf("shard map epoch %d is below 1", m.Epoch)
	}
	if err := storedText(m.Hash, "shard map hash"); err != nil {
		return err
	}
	if len(m.Shards) < 1 || len(m.Shards) > MaxShards {
		return fmt.Errorf("shard map lists %d shards, not 1 to %d", len(m.Shards), MaxShards)
	}
	if m.HomeShards < 0 || m.HomeShards > len(m.Shards) {
		return fmt.Errorf("shard map places home shards over %d of its %d shards, not 1 to %d", m.HomeShards, len(m.Shards), len(m.Shards))
	}
	seen := map[ShardMapShard]int{}
	for i, s := range m.Shards {
		if err := storedText(s.ClusterID, "shard cluster ID"); err != nil {
			return err
		}
		if err := ValidateNamespace(s.Namespace); err != nil {
			return err
		}
		if j, ok := seen[s]; ok {
			return fmt.Errorf("shards %d and %d are both cluster %s namespace %q", j, i, s.ClusterID, s.Namespace)
		}
		seen[s] = i
	}
	return nil
}

// Diff names the first difference between m (the stored map) and want (a
// store's configured map), "" when they are equal.
func (m ShardMap) Diff(want ShardMap) string {
	switch {
	case m.Hash != want.Hash:
		return fmt.Sprintf("stored hash %q, configured %q", m.Hash, want.Hash)
	case m.Epoch != want.Epoch:
		return fmt.Sprintf("stored epoch %d, configured %d", m.Epoch, want.Epoch)
	case want.HomeShards != 0 && m.Homes() != want.Homes():
		return fmt.Sprintf("stored map places home shards over %d shards, configured %d", m.Homes(), want.Homes())
	case len(m.Shards) != len(want.Shards):
		return fmt.Sprintf("stored map has %d shards (%s), configured %d (%s)",
			len(m.Shards), m.list(), len(want.Shards), want.list())
	}
	for i := range m.Shards {
		if m.Shards[i] != want.Shards[i] {
			return fmt.Sprintf("shard %d is cluster %s namespace %q in the stored map, cluster %s namespace %q configured",
				i, m.Shards[i].ClusterID, m.Shards[i].Namespace, want.Shards[i].ClusterID, want.Shards[i].Namespace)
		}
	}
	return ""
}

func (m ShardMap) list() string {
	parts := make([]string, len(m.Shards))
	for i, s := range m.Shards {
		parts[i] = s.ClusterID + s.Namespace
	}
	return strings.Join(parts, ", ")
}

// DecodeShardMap decodes the shard-map key strictly (ErrCorrupt names the
// key).
func DecodeShardMap(kv *mvccpb.KeyValue) (ShardMap, error) {
	var w shardMapWire
	if err := decodeStrict(kv.Value, &w); err != nil {
		return ShardMap{}, corrupt(string(kv.Key), err)
	}
	m := w.shardMap()
	if err := m.Check(); err != nil {
		return ShardMap{}, corrupt(string(kv.Key), err)
	}
	return m, nil
}

// decodeShardMap decodes a key under SegShardMap.
func (e *Entry) decodeShardMap(namespace string, kv *mvccpb.KeyValue) error {
	if string(kv.Key) != (Layout{ns: namespace}).ShardMap() {
		return e.decodeReshard(namespace, kv)
	}
	m, err := DecodeShardMap(kv)
	if err != nil {
		return err
	}
	e.ShardMap = &m
	return nil
}
