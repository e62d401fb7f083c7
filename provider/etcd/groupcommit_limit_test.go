package etcd_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
)

// Under a capacity policy, a reservation whose own Txn fits the request
// limit but not together with its capacity fence and snapshot reads is
// refused with ErrLimitExceeded, not deferred round after round (the batch
// leader used to re-read until the caller's deadline, holding up every
// reservation of the node).
func TestGroupCommitRefusesWhatNeverFits(t *testing.T) {
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, nil, etcdstore.Config{Clock: clock, MaxRequestBytes: 64 * 1024})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	s.SetCapacityPolicy(conformance.ActorLimit(1000))
	reserved, refused := 0, 0
	for size := 64*1024 - 1400; size <= 64*1024; size += 20 {
		req := fx.ReserveRequest(authority.ObjectActor, fmt.Sprintf("k%d", size), conformance.TargetA)
		req.CreatingPayload = bytes.Repeat([]byte{'x'}, size)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		out, err := s.Reserve(ctx, req)
		cancel()
		switch {
		case err == nil:
			require.Equal(t, authority.KindReserved, out.Kind, "payload %d", size)
			reserved++
		case errors.Is(err, authority.ErrLimitExceeded):
			require.Contains(t, err.Error(), "max-request-bytes")
			refused++
			key, kerr := req.Key.Encode()
			require.NoError(t, kerr)
			fx.RequireMissing(key)
		default:
			t.Fatalf("payload %d: neither reserved nor refused as too large: %v", size, err)
		}
	}
	require.Positive(t, reserved)
	require.Positive(t, refused)
	t.Logf("%d reserved, %d refused as too large", reserved, refused)
}

// A reservation that fits a Txn alone, but not with the reads of a whole
// batch of concurrent reservations, is decided alone in the next round:
// it and every concurrent reservation are reserved.
func TestGroupCommitDecidesABigReservationAlone(t *testing.T) {
	clock := authority.NewManualClock(testEpoch)
	s := newStore(t, nil, etcdstore.Config{Clock: clock, MaxRequestBytes: 64 * 1024})
	fx := conformance.NewFixture(t, harnessFor(s, clock))
	s.SetCapacityPolicy(conformance.ActorLimit(1000))
	// the largest payload that is reserved on its own
	big := 0
	for size := 64 * 1024; size > 60*1024 && big == 0; size -= 20 {
		req := fx.ReserveRequest(authority.ObjectActor, fmt.Sprintf("probe%d", size), conformance.TargetA)
		req.CreatingPayload = bytes.Repeat([]byte{'x'}, size)
		if out, err := s.Reserve(context.Background(), req); err == nil && out.Kind == authority.KindReserved {
			big = size
		}
	}
	require.Positive(t, big)
	for round := range 5 {
		var wg sync.WaitGroup
		errs := make([]error, 33)
		kinds := make([]authority.ResultKind, 33)
		reqs := make([]authority.ReserveRequest, 33) // the fixture is not safe for concurrent use
		for i := range reqs {
			reqs[i] = fx.ReserveRequest(authority.ObjectActor, fmt.Sprintf("r%d-%d", round, i), conformance.TargetA)
		}
		reqs[0].CreatingPayload = bytes.Repeat([]byte{'x'}, big)
		for i := range 33 {
			wg.Go(func() {
				req := reqs[i]
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				out, err := s.Reserve(ctx, req)
				errs[i], kinds[i] = err, out.Kind
			})
		}
		wg.Wait()
		for i := range 33 {
			require.NoError(t, errs[i], "round %d request %d", round, i)
			require.Equal(t, authority.KindReserved, kinds[i], "round %d request %d", round, i)
		}
	}
}
