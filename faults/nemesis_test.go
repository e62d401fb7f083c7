package faults_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/zlink-systems/authority/internal/testkit/etcdcluster"
)

// nemesis injects faults into a cluster and counts them by kind.
type nemesis struct {
	c   *etcdcluster.Cluster
	rng *rand.Rand

	mu     sync.Mutex
	counts map[string]int
	total  int
}

func newNemesis(c *etcdcluster.Cluster, seed uint64) *nemesis {
	return &nemesis{c: c, rng: rand.New(rand.NewPCG(seed, 0x6e656d)), counts: map[string]int{}}
}

func (n *nemesis) count(kind string) {
	n.mu.Lock()
	n.counts[kind]++
	n.total++
	n.mu.Unlock()
}

// injected returns the number of faults injected and a summary by kind.
func (n *nemesis) injected() (int, string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.total, fmt.Sprintf("kill-leader=%d blackhole=%d hold-replies=%d drop=%d",
		n.counts["kill-leader"], n.counts["blackhole"], n.counts["hold-replies"], n.counts["drop"])
}

// killLeader crashes the leader (SIGKILL), keeps it down for down, restarts
// it and waits until the cluster is healthy again. The restart happens
// whatever ctx says.
func (n *nemesis) killLeader(ctx context.Context, down time.Duration) error {
	lctx, cancel := context.WithTimeout(ctx, settleTimeout)
	defer cancel()
	leader, err := n.c.Leader(lctx)
	if err != nil {
		if ctx.Err() != nil { // the run ended during the lookup: nothing injected
			return nil
		}
		return err
	}
	if err := n.c.Kill(leader); err != nil {
		return err
	}
	n.count("kill-leader")
	sleepCtx(ctx, down)
	if err := n.c.Restart(leader); err != nil {
		return err
	}
	hctx, hcancel := context.WithTimeout(context.Background(), settleTimeout)
	defer hcancel()
	return n.c.WaitHealthy(hctx)
}

// partition puts a random member's proxy in mode (blackhole, hold-replies
// or drop) for d, then heals it whatever ctx says.
func (n *nemesis) partition(ctx context.Context, kind string, d time.Duration) error {
	n.mu.Lock()
	i := n.rng.IntN(n.c.Size())
	n.mu.Unlock()
	var err error
	switch kind {
	case "blackhole":
		err = n.c.Blackhole(i)
	case "hold-replies":
		err = n.c.HoldReplies(i)
	case "drop":
		err = n.c.Drop(i)
	default:
		return fmt.Errorf("nemesis: unknown fault %q", kind)
	}
	if err != nil {
		return err
	}
	n.count(kind)
	sleepCtx(ctx, d)
	return n.c.Heal(i)
}

// cycle runs the given faults in turn, with a pause between them, until ctx
// ends. It returns the first error.
func (n *nemesis) cycle(ctx context.Context, pause time.Duration, faults ...func(context.Context) error) error {
	for i := 0; ; i++ {
		if !sleepCtx(ctx, pause) {
			return nil
		}
		if err := faults[i%len(faults)](ctx); err != nil {
			return err
		}
	}
}
