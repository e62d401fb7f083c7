package etcd_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/internal/testkit/etcdtest"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A reference whose key is already taken is drawn again: the blob lands under
// a fresh reference and the taken key keeps its value.
func TestRelocationReferenceCollisionDrawsAgain(t *testing.T) {
	ns := etcdtest.Namespace()
	s := newStore(t, nil, etcdstore.Config{Namespace: ns, Clock: authority.NewManualClock(testEpoch)})
	ctx := context.Background()
	taken, fresh := uuid.NewString(), uuid.NewString()
	_, err := shared.Put(ctx, ns+"blobs/"+taken, "someone else's")
	require.NoError(t, err)

	etcdstore.DrawBlobReferences(t, taken, fresh)
	receipt, err := s.Relocation().PutNew(ctx, []byte("state"), time.Minute)
	require.NoError(t, err)
	require.Equal(t, authority.BlobReference(fresh), receipt.Reference)

	got, err := s.Relocation().Read(ctx, receipt.Reference)
	require.NoError(t, err)
	require.Equal(t, authority.KindFound, got.Kind)
	require.Equal(t, []byte("state"), got.Bytes)

	resp, err := shared.Get(ctx, ns+"blobs/"+taken)
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	require.Equal(t, "someone else's", string(resp.Kvs[0].Value))
}

// When every draw collides PutNew gives up with ErrUnavailable and writes
// nothing.
func TestRelocationReferenceCollisionsGiveUp(t *testing.T) {
	ns := etcdtest.Namespace()
	s := newStore(t, nil, etcdstore.Config{Namespace: ns, Clock: authority.NewManualClock(testEpoch)})
	ctx := context.Background()
	taken := uuid.NewString()
	_, err := shared.Put(ctx, ns+"blobs/"+taken, "someone else's")
	require.NoError(t, err)

	etcdstore.DrawBlobReferences(t, taken, taken, taken)
	_, err = s.Relocation().PutNew(ctx, []byte("state"), time.Minute)
	require.True(t, errors.Is(err, authority.ErrUnavailable), "got %v", err)

	resp, err := shared.Get(ctx, ns+"blobs/", clientv3.WithPrefix())
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	require.Equal(t, "someone else's", string(resp.Kvs[0].Value))
}
