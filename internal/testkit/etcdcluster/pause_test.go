package etcdcluster

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestPausedLeaderIsReplaced: a leader paused with SIGSTOP stops answering,
// the others elect a new leader and keep serving writes, and after Resume
// the old leader rejoins as a follower with every write.
func TestPausedLeaderIsReplaced(t *testing.T) {
	ctx := testContext(t)
	c := Start(t, Options{})
	leader, err := c.Leader(ctx)
	require.NoError(t, err)
	require.NoError(t, c.Pause(leader))

	paused := c.MemberClient(t, leader)
	rctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = paused.Get(rctx, "k")
	cancel()
	require.Error(t, err, "a paused member answered")

	others := []int{(leader + 1) % 3, (leader + 2) % 3}
	cli := c.MemberClient(t, others[0])
	require.NoError(t, putEventually(ctx, cli, "k", "written while paused"))
	next, err := c.Leader(ctx)
	require.NoError(t, err)
	require.NotEqual(t, leader, next)

	require.NoError(t, c.Resume(leader))
	require.NoError(t, c.WaitHealthy(ctx))
	resp, err := paused.Get(ctx, "k")
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	require.Equal(t, "written while paused", string(resp.Kvs[0].Value))

	// Stop ends a paused member too
	require.NoError(t, c.Pause(others[1]))
	require.NoError(t, c.Stop(others[1]))
	require.False(t, c.Running(others[1]))
}
