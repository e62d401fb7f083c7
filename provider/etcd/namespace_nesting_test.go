package etcd_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/internal/etcdtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
)

// No store opens inside another store's key layout: a namespace with a
// layout segment as one of its path segments is refused, so the store on
// ns can never read, list or overwrite the rows of a store on ns+"rows/".
func TestNamespaceInsideAnotherLayoutIsRefused(t *testing.T) {
	outer := etcdtest.Namespace()
	for _, seg := range []string{"rows", "owners", "owner-gens", "owner-rows", "capacity", "capacity-epochs",
		"reservations", "terminals", "aggregates", "blobs"} {
		for _, ns := range []string{outer + seg + "/", outer + seg + "/actor/", "/" + seg + "/", seg + "/x/"} {
			_, err := etcdstore.New(context.Background(), etcdstore.Config{Client: shared, Namespace: ns})
			require.ErrorIs(t, err, authority.ErrInvalidArgument, "namespace %q", ns)
			require.ErrorContains(t, err, seg)
		}
	}
	// names that merely start like a segment lie outside every layout
	for _, ns := range []string{outer + "rowsx/", outer + "my-rows/", outer + "tenant/"} {
		s, err := etcdstore.New(context.Background(), etcdstore.Config{Client: shared, Namespace: ns})
		require.NoError(t, err, "namespace %q", ns)
		require.NoError(t, s.Close())
	}
}
