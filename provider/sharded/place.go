package sharded

import authority "github.com/zlink-systems/authority"

// Place returns the shard of key in a map of shards shards (HashName): the
// function every store routes rows by, for tools that work on the map
// (package reshard).
func Place(key authority.Key, shards int) int { return shardOf(string(key), shards) }
