package sharded

import (
	"testing"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/provider/etcd/schema"
)

// TestRowNumbering: over one shard every number is the shard's revision;
// over several it is revision × VersionStride + shard, decoded back only
// for its own shard (any other text matches no row of the shard), and a
// revision too large to encode is ErrCorrupt, never a wrapped number.
func TestRowNumbering(t *testing.T) {
	one := numbering{n: 1}
	v, err := one.version(0, "42")
	require.NoError(t, err)
	require.Equal(t, authority.StoreVersion("42"), v)
	require.Equal(t, authority.StoreVersion("42"), one.shardVersion(0, "42"))

	three := numbering{n: 3}
	v, err = three.version(2, "42")
	require.NoError(t, err)
	require.Equal(t, schema.Version(42*VersionStride+2), v)
	require.Equal(t, authority.StoreVersion("42"), three.shardVersion(2, v))
	for i := range 3 {
		if i != 2 {
			other := three.shardVersion(i, v)
			_, ok := schema.ParseVersion(other)
			require.False(t, ok, "another shard's version names no row of shard %d: %q", i, other)
		}
	}
	for _, junk := range []authority.StoreVersion{"x", "-1", "007", "1023", "0"} {
		_, ok := schema.ParseVersion(three.shardVersion(0, junk))
		require.False(t, ok, "%q", junk)
	}
	require.Equal(t, authority.StoreVersion(""), three.shardVersion(1, ""))
	_, err = three.version(0, "not a revision")
	require.ErrorIs(t, err, authority.ErrCorrupt)

	n, err := three.encode(1, maxEncodable)
	require.NoError(t, err)
	require.Positive(t, n)
	_, err = three.encode(1, maxEncodable+1)
	require.ErrorIs(t, err, authority.ErrCorrupt)

	snap := &authority.Snapshot{StoreVersion: "9", ObjectGeneration: 3, AuthorityOwnerGeneration: 5, OwnershipToken: 7}
	got, err := three.snapshot(1, snap)
	require.NoError(t, err)
	require.Equal(t, authority.Snapshot{StoreVersion: schema.Version(9*VersionStride + 1), ObjectGeneration: 3*VersionStride + 1,
		AuthorityOwnerGeneration: 5*VersionStride + 1, OwnershipToken: 7*VersionStride + 1}, *got)
	require.Equal(t, authority.StoreVersion("9"), snap.StoreVersion, "the shard's snapshot is left as it was")
}
