package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestWritingCommandOnOneShard: a writing command pointed at one shard's
// namespace of a store of several opens it as a shard member (a plain
// writing store is refused there, etcd.ErrShardedNamespace) and runs.
func TestWritingCommandOnOneShard(t *testing.T) {
	_, _, _, cfgs := shardedFixture(t)
	out, errOut, code := cli(t, nil, on(cfgs[0].Namespace, "prune-epochs", "--yes", "-o", "json")...)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, `"pruned": 0`)
}
