package etcdcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// testTimeout bounds each test's waits; a healthy run takes a few seconds.
const testTimeout = 30 * time.Second

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// putEventually retries a Put until it succeeds or ctx ends (a request may
// land on a member that is down or electing).
func putEventually(ctx context.Context, cli *clientv3.Client, key, val string) error {
	for {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := cli.Put(rctx, key, val)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("put %s: %w (last: %v)", key, ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func TestClusterWritesThroughEveryProxy(t *testing.T) {
	ctx := testContext(t)
	c := Start(t, Options{})
	require.Equal(t, 3, c.Size())
	eps := c.Endpoints()
	require.Len(t, eps, 3)
	for i, ep := range eps {
		require.Equal(t, c.Endpoint(i), ep)
		require.NotContains(t, ep, ":2379")
		require.NotContains(t, ep, ":2380")
	}

	ids := map[uint64]bool{}
	for i := range c.Size() {
		id, err := c.MemberID(ctx, i)
		require.NoError(t, err)
		ids[id] = true
		require.NotZero(t, c.PID(i))
	}
	require.Len(t, ids, 3, "three distinct members")

	// Each member, reached only through its proxy, writes and reads what
	// the others wrote.
	for i := range c.Size() {
		cli := c.MemberClient(t, i)
		_, err := cli.Put(ctx, fmt.Sprintf("k%d", i), fmt.Sprintf("v%d", i))
		require.NoError(t, err)
	}
	cli := c.Client(t)
	resp, err := cli.Get(ctx, "k", clientv3.WithPrefix())
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 3)
	for i, kv := range resp.Kvs {
		require.Equal(t, fmt.Sprintf("v%d", i), string(kv.Value))
	}
	leader, err := c.Leader(ctx)
	require.NoError(t, err)
	require.GreaterOrEqual(t, leader, 0)
	require.Less(t, leader, 3)
	require.NoError(t, c.WaitHealthy(ctx))
}

func TestKillLeaderElectsNewLeaderAndWritesContinue(t *testing.T) {
	ctx := testContext(t)
	c := Start(t, Options{})
	cli := c.Client(t)
	require.NoError(t, putEventually(ctx, cli, "before", "1"))

	old, err := c.Leader(ctx)
	require.NoError(t, err)
	pid := c.PID(old)
	require.NoError(t, c.Kill(old))
	require.False(t, c.Running(old))
	require.ErrorIs(t, syscall.Kill(pid, 0), syscall.ESRCH, "the killed process must be gone")
	require.ErrorIs(t, c.Kill(old), ErrNotRunning)

	next, err := c.Leader(ctx)
	require.NoError(t, err)
	require.NotEqual(t, old, next)
	require.NoError(t, putEventually(ctx, cli, "after", "2"))
	resp, err := cli.Get(ctx, "after")
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	require.NoError(t, c.WaitHealthy(ctx), "the two survivors are healthy")
	t.Logf("leader-kill: old=%d new=%d", old, next)
}

func TestKilledMemberRestartsFromItsDataDirAndCatchesUp(t *testing.T) {
	ctx := testContext(t)
	c := Start(t, Options{Fsync: true})
	const victim = 2
	id, err := c.MemberID(ctx, victim)
	require.NoError(t, err)
	require.NoError(t, c.Kill(victim))

	cli := c.MemberClient(t, 0)
	const n = 50
	for i := range n {
		require.NoError(t, putEventually(ctx, cli, fmt.Sprintf("catchup/%02d", i), "v"))
	}

	require.ErrorIs(t, c.Restart(0), ErrRunning)
	require.NoError(t, c.Restart(victim))
	require.NoError(t, c.WaitHealthy(ctx))
	again, err := c.MemberID(ctx, victim)
	require.NoError(t, err)
	require.Equal(t, id, again, "restarted from its data dir, the same member")

	// A linearizable read through the victim alone is answered only once it
	// applied everything committed; a serializable one shows its local state.
	vcli := c.MemberClient(t, victim)
	resp, err := vcli.Get(ctx, "catchup/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	require.EqualValues(t, n, resp.Count)
	resp, err = vcli.Get(ctx, "catchup/", clientv3.WithPrefix(), clientv3.WithCountOnly(), clientv3.WithSerializable())
	require.NoError(t, err)
	require.EqualValues(t, n, resp.Count)
}

func TestStopIsGracefulAndWholeClusterRestarts(t *testing.T) {
	ctx := testContext(t)
	c := Start(t, Options{})
	cli := c.Client(t)
	require.NoError(t, putEventually(ctx, cli, "durable", "yes"))

	require.NoError(t, c.Stop(0), "SIGTERM exits cleanly")
	require.NoError(t, c.Kill(1))
	require.NoError(t, c.Kill(2))
	for i := range c.Size() {
		require.False(t, c.Running(i))
	}
	for i := range c.Size() {
		require.NoError(t, c.Restart(i))
	}
	require.NoError(t, c.WaitHealthy(ctx))
	resp, err := cli.Get(ctx, "durable")
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	require.Equal(t, "yes", string(resp.Kvs[0].Value))
}

func TestBlackholeHangsMemberAndHealRestores(t *testing.T) {
	ctx := testContext(t)
	c := Start(t, Options{})
	const i = 1
	cli := c.MemberClient(t, i)
	_, err := cli.Put(ctx, "k", "before")
	require.NoError(t, err)

	require.NoError(t, c.Blackhole(i))
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = cli.Get(short, "k")
	cancel()
	require.Error(t, err)
	require.True(t, isDeadline(err), "got %v", err)
	// The proxy still accepts connections: blackholed, not refused.
	conn, err := net.Dial("tcp", c.Endpoint(i))
	require.NoError(t, err)
	require.NoError(t, conn.Close())
	// The member itself is fine; the others serve.
	require.NoError(t, c.WaitHealthy(ctx))
	_, err = c.MemberClient(t, 0).Put(ctx, "k", "during")
	require.NoError(t, err)

	require.NoError(t, c.Heal(i))
	resp, err := cli.Get(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, "during", string(resp.Kvs[0].Value))
}

func TestDropRefusesConnectionsAndHealRestores(t *testing.T) {
	ctx := testContext(t)
	c := Start(t, Options{})
	const i = 0
	cli := c.MemberClient(t, i)
	_, err := cli.Put(ctx, "k", "v")
	require.NoError(t, err)

	require.NoError(t, c.Drop(i))
	_, err = net.Dial("tcp", c.Endpoint(i))
	require.ErrorIs(t, err, syscall.ECONNREFUSED)
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err = cli.Get(short, "k")
	cancel()
	require.Error(t, err)

	require.NoError(t, c.Heal(i))
	resp, err := cli.Get(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, "v", string(resp.Kvs[0].Value))
}

func TestHoldRepliesLetsWriteCommitUnseen(t *testing.T) {
	ctx := testContext(t)
	c := Start(t, Options{})
	const i = 2
	cli := c.MemberClient(t, i)
	_, err := cli.Put(ctx, "warm", "up")
	require.NoError(t, err)

	require.NoError(t, c.HoldReplies(i))
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err = cli.Put(short, "ambiguous", "written")
	cancel()
	require.Error(t, err, "the reply is held, the client times out")

	// The write reached the member and committed nonetheless.
	other := c.MemberClient(t, 0)
	require.Eventually(t, func() bool {
		resp, err := other.Get(ctx, "ambiguous")
		return err == nil && len(resp.Kvs) == 1 && string(resp.Kvs[0].Value) == "written"
	}, 10*time.Second, 20*time.Millisecond)
	require.NoError(t, c.Heal(i))
	_, err = cli.Get(ctx, "ambiguous")
	require.NoError(t, err)
}

func TestCleanupLeavesNoProcess(t *testing.T) {
	var pids []int
	t.Run("cluster", func(t *testing.T) {
		c := Start(t, Options{})
		for i := range c.Size() {
			pids = append(pids, c.PID(i))
		}
		require.NoError(t, c.Kill(0)) // a killed member and running ones
	})
	require.Len(t, pids, 3)
	for _, pid := range pids {
		require.ErrorIs(t, syscall.Kill(pid, 0), syscall.ESRCH, "process %d survived cleanup", pid)
	}
}

// isDeadline reports whether err is a deadline, plain or as a gRPC status.
func isDeadline(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || status.Code(err) == codes.DeadlineExceeded
}

func TestMemberExitsWhenParentGoes(t *testing.T) {
	c := Start(t, Options{Members: 1})
	require.Equal(t, 1, c.Size())
	m := c.members[0]
	m.mu.Lock()
	p := m.proc
	m.mu.Unlock()
	// The parent's death closes the member's standard input; simulate it.
	require.NoError(t, p.stdin.Close())
	select {
	case <-p.exited:
	case <-time.After(testTimeout):
		t.Fatal("member outlived its parent's end of the pipe")
	}
	require.ErrorIs(t, syscall.Kill(p.cmd.Process.Pid, 0), syscall.ESRCH)
}

// TestStartDrawsNewPortsWhenOneIsTaken: a port taken by another process
// between freePorts' check and a member's bind (other test binaries start
// clusters at the same time) makes Start draw new ports, not fail.
func TestStartDrawsNewPortsWhenOneIsTaken(t *testing.T) {
	var taken net.Listener
	draws := 0
	drawPorts = func(n int) ([]int, error) {
		ports, err := freePorts(n)
		if err == nil && draws == 0 {
			taken, err = net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", ports[1])) // m0's client port
		}
		draws++
		return ports, err
	}
	t.Cleanup(func() { drawPorts = freePorts })
	c := Start(t, Options{})
	require.NotNil(t, taken)
	defer taken.Close()
	require.Equal(t, 2, draws)
	for _, m := range c.members {
		require.NotContains(t, m.clientURL, taken.Addr().String())
	}
	cli := c.Client(t)
	require.NoError(t, putEventually(testContext(t), cli, "k", "v"))
}
