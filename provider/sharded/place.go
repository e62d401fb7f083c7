package sharded

import (
	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/provider/etcd/schema"
)

// Place returns the shard of key in a map of shards shards (HashName): the
// function every store routes rows by, for tools that work on the map
// (package reshard).
func Place(key authority.Key, shards int) int { return shardOf(string(key), shards) }

// PlaceCoordinator returns the coordinator shard of the aggregate
// aggregateID under the map m: the shard holding the record of its
// aggregates across shards, among m's home shards (schema.ShardMap.Homes),
// the same in every map a resharding grows from m.
func PlaceCoordinator(aggregateID string, m schema.ShardMap) int {
	return coordinatorOf(aggregateID, min(m.Homes(), len(m.Shards)))
}
