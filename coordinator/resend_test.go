package coordinator_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/coordinator"
)

// commitThenClosed: the first Commit applies and reports ErrOutcomeUnknown,
// the re-sends get a definite "not applied" error of another kind (the
// store closing during shutdown).
type commitThenClosed struct {
	authority.Store
	commits atomic.Int64
}

func (s *commitThenClosed) Commit(ctx context.Context, req authority.CommitRequest) (authority.CommitResult, error) {
	if s.commits.Add(1) == 1 {
		if _, err := s.Store.Commit(ctx, req); err != nil {
			return authority.CommitResult{}, err
		}
		return authority.CommitResult{}, authority.Wrap(authority.ErrOutcomeUnknown, "reply lost", nil)
	}
	return authority.CommitResult{}, authority.Wrap(authority.ErrClosed, "store closed", nil)
}

// A re-send's definite failure says nothing about the first,
// unknown commit; the rollback must still not discard the object.
func TestResendDefiniteErrorKeepsOutcomeUnknown(t *testing.T) {
	e := newEnv(t, memoryFactory)
	store := &commitThenClosed{Store: e.h.Store}
	c, _ := newCoordinator(t, store, coordinator.UserSpotOptions{CleanupTimeout: 100 * time.Millisecond}, localTarget())
	a := &app{}
	_, err := c.GetOrCreate(e.ctx, request("spot-1"), a.materialize, a.discard)
	t.Logf("err: %v", err)
	require.Error(t, err)
	requireReadyUserSpot(t, e, "spot-1")
	require.Equal(t, int64(0), a.discarded.Load(), "the object of a Ready Spot was discarded")
}
