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
}

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
}

type shardWire struct {
	C string `json:"c"`
	N string `json:"n"`
}

// Encode returns the stored value of m (a JSON object).
func (m ShardMap) Encode() string {
	w := shardMapWire{E: m.Epoch, H: m.Hash, S: make([]shardWire, len(m.Shards))}
	for i, s := range m.Shards {
		w.S[i] = shardWire{C: s.ClusterID, N: s.Namespace}
	}
	b, _ := json.Marshal(w)
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
	m := ShardMap{Epoch: w.E, Hash: w.H, Shards: make([]ShardMapShard, len(w.S))}
	for i, s := range w.S {
		m.Shards[i] = ShardMapShard{ClusterID: s.C, Namespace: s.N}
	}
	if err := m.Check(); err != nil {
		return ShardMap{}, corrupt(string(kv.Key), err)
	}
	return m, nil
}

// decodeShardMap decodes a key under SegShardMap.
func (e *Entry) decodeShardMap(namespace string, kv *mvccpb.KeyValue) error {
	if string(kv.Key) != (Layout{ns: namespace}).ShardMap() {
		return errBadKey
	}
	m, err := DecodeShardMap(kv)
	if err != nil {
		return err
	}
	e.ShardMap = &m
	return nil
}
