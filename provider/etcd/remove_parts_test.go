package etcd_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
)

// RemoveAllByOwner removes an owner whose rows add up to more than the
// client's receive limit: it reads them in parts (it used to answer
// ErrLimitExceeded on every retry, so a dead node's rows stayed for good).
func TestRemoveAllByOwnerOverReceiveLimit(t *testing.T) {
	s, fx := limitedStore(t, "")
	payload := bytes.Repeat([]byte("p"), 100*1024) // 6 rows: ≈ 600 KiB, over 256 KiB
	for i := range 6 {
		id := fmt.Sprintf("big-%d", i)
		snap := fx.Active(authority.ObjectUserSpot, id, conformance.TargetA)
		fx.Put(fx.Key(authority.ObjectUserSpot, id), snap.StoreVersion, payload)
	}
	removed, err := s.RemoveAllByOwner(context.Background(), conformance.TargetA.Owner)
	require.NoError(t, err)
	require.Equal(t, int64(6), removed)
	for i := range 6 {
		fx.RequireMissing(fx.Key(authority.ObjectUserSpot, fmt.Sprintf("big-%d", i)))
	}
	fx.RequireUsage(conformance.NodeA, authority.ObjectUserSpot, conformance.DefaultStableType, 0, 0)
}

// PrepareAggregate prepares an aggregate whose participants' rows add up to
// more than the client's receive limit (it used to fail on every retry).
func TestPrepareAggregateOverReceiveLimit(t *testing.T) {
	s, fx := limitedStore(t, "")
	payload := bytes.Repeat([]byte("p"), 60*1024) // 6 rows: ≈ 360 KiB, over 256 KiB
	var parts []authority.AggregateParticipant
	for i := range 6 {
		id := fmt.Sprintf("big-%d", i)
		from, transition := conformance.TargetB, authority.TransitionPreserve
		if i == 0 { // one row moves to the target; the others stay there
			from, transition = conformance.TargetA, authority.TransitionNewOwner
		}
		snap := fx.Active(authority.ObjectActor, id, from)
		k := fx.Key(authority.ObjectActor, id)
		snap = fx.Put(k, snap.StoreVersion, payload)
		parts = append(parts, conformance.Participant(k, snap.StoreVersion, transition, []byte("moved")))
	}
	req := conformance.AggregateRequest("wide", 1, conformance.TargetB, authority.CapacityVector{Actors: 1}, parts...)
	res, err := s.PrepareAggregate(context.Background(), req)
	require.NoError(t, err)
	require.Equal(t, authority.KindPrepared, res.Kind)
}
