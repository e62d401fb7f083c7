package schema

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/mvccpb"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/provider/etcd/storeversion"
)

// TestMovedRowKeepsItsNumbers: a row a resharding copied into another
// cluster reads back, in both formats, with the version, object
// generation, owner generation and token it had in its source, whatever its
// key's revisions in the new cluster; a write of it there (Next) keeps them
// but takes a version of its own; a value whose object generation or
// version is not below its own ModRevision is corrupt.
func TestMovedRowKeepsItsNumbers(t *testing.T) {
	src := goldenRow(authority.AllocationActive)
	src.CreateRev, src.ModRev = 31, 40
	moved := src.Moved()
	require.Equal(t, int64(31), moved.ObjectGen)
	for _, v := range []storeversion.Version{storeversion.Base, storeversion.RowMoves} {
		value := moved.EncodeAt(v)
		// copied at revision 900 of the new cluster, created there at 880
		kv := &mvccpb.KeyValue{Key: []byte("/ns/rows/user_spot/room-1"), Value: []byte(value), CreateRevision: 880, ModRevision: 900}
		got, err := DecodeRow("user_spot/room-1", kv)
		require.NoError(t, err, "version %s", v)
		snap := got.Snapshot(goldenTime)
		require.Equal(t, int64(31), snap.ObjectGeneration, "version %s", v)
		require.Equal(t, int64(7), snap.AuthorityOwnerGeneration)
		require.Equal(t, int64(9), snap.OwnershipToken)
		require.Equal(t, Version(40), snap.StoreVersion, "the copy is the same state: its version")
		// a later write in the new cluster keeps the object generation
		next := got.Next(0)
		again, err := DecodeRow("user_spot/room-1", &mvccpb.KeyValue{Key: kv.Key, Value: []byte(next.EncodeAt(v)), CreateRevision: 880, ModRevision: 950})
		require.NoError(t, err)
		require.Equal(t, int64(31), again.Generation())
		require.Equal(t, Version(950), again.Version(), "a write in the new cluster takes its own version")
		// copied again (a second resharding): the same version still
		twice, err := DecodeRow("user_spot/room-1", &mvccpb.KeyValue{Key: kv.Key, Value: []byte(got.Moved().EncodeAt(v)), CreateRevision: 1200, ModRevision: 1200})
		require.NoError(t, err)
		require.Equal(t, Version(40), twice.Version())
		require.Equal(t, int64(31), twice.Generation())
		// an object generation above the value's own revision names no
		// earlier write
		_, err = DecodeRow("user_spot/room-1", &mvccpb.KeyValue{Key: kv.Key, Value: []byte(value), CreateRevision: 20, ModRevision: 30})
		requireCorrupt(t, "object generation above the revision", err)
		_, err = DecodeRow("user_spot/room-1", &mvccpb.KeyValue{Key: kv.Key, Value: []byte(value), CreateRevision: 20, ModRevision: 40})
		requireCorrupt(t, "version at the revision", err)
	}
	// a row no resharding copied has no field and reads its CreateRevision
	plain := goldenRow(authority.AllocationActive)
	got, err := DecodeRow("user_spot/room-1", &mvccpb.KeyValue{Key: []byte("k"), Value: []byte(plain.EncodeAt(storeversion.RowMoves)), CreateRevision: 12, ModRevision: 14})
	require.NoError(t, err)
	require.Equal(t, int64(12), got.Snapshot(goldenTime).ObjectGeneration)
	require.NotContains(t, plain.Encode(), `"cg"`)
}
