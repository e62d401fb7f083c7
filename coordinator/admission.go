package coordinator

import (
	"context"
	"math"
	"sync"
)

// admission is one in-flight creation that concurrent callers share.
type admission struct {
	fingerprint fingerprint
	done        chan struct{}
	result      CreateResult
	err         error
}

// wait returns the creation's outcome once it is settled, or ctx's error if
// ctx ends first. A settled outcome wins over an ended ctx: the caller that
// ran the creation gets what it did, not its own deadline.
func (a *admission) wait(ctx context.Context) (CreateResult, error) {
	select {
	case <-a.done:
		return a.result, a.err
	default:
	}
	select {
	case <-a.done:
		return a.result, a.err
	case <-ctx.Done():
		return CreateResult{}, ctx.Err()
	}
}

// creationPanicked is the error that settles the admission of a creation
// whose materialize, hook or publication panicked (the panic itself goes on
// in the caller that ran it).
func creationPanicked() error {
	return newError(KindRequestFailed, "User Spot creation panicked; its rollback was attempted.", false, nil)
}

// spotGate serializes, for one User Spot, the local reservations of one
// coordinator from before their Reserve until the winner's admission is
// registered (or the loser has looked it up). A single-threaded runtime makes
// that step atomic; without it a loser could look for the winner's
// admission before it exists, or after it was removed, and wait for a Ready
// row that a rejected creation never writes.
type spotGate struct {
	token chan struct{} // holds one value while a caller is inside
	// issued counts the tickets handed out; active are those of the callers
	// inside or waiting.
	issued uint64
	active map[uint64]struct{}
	// finished are local admissions settled while the gate was in use, each
	// with the last ticket issued when it settled. A caller with a later
	// ticket entered after the creation's commit or abort was applied, so
	// its Reserve cannot meet that reservation: an admission is removed once
	// every caller with a ticket up to its own has left.
	finished []finishedAdmission
}

type finishedAdmission struct {
	key    string // reservation ID
	ticket uint64
}

// lockSpot enters spotID's gate. The returned unlock may be called more than
// once; only the first call leaves.
func (c *UserSpotCoordinator) lockSpot(ctx context.Context, spotID string) (unlock func(), err error) {
	c.mu.Lock()
	g := c.gates[spotID]
	if g == nil {
		g = &spotGate{token: make(chan struct{}, 1), active: map[uint64]struct{}{}}
		c.gates[spotID] = g
	}
	g.issued++
	ticket := g.issued
	g.active[ticket] = struct{}{}
	c.mu.Unlock()
	select {
	case g.token <- struct{}{}:
	case <-ctx.Done():
		c.leaveGate(spotID, g, ticket)
		return nil, ctx.Err()
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			<-g.token
			c.leaveGate(spotID, g, ticket)
		})
	}, nil
}

func (c *UserSpotCoordinator) leaveGate(spotID string, g *spotGate, ticket uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(g.active, ticket)
	if len(g.active) == 0 {
		for _, f := range g.finished {
			delete(c.local, f.key)
		}
		delete(c.gates, spotID)
		return
	}
	oldest := uint64(math.MaxUint64)
	for t := range g.active {
		oldest = min(oldest, t)
	}
	kept := g.finished[:0]
	for _, f := range g.finished {
		if f.ticket < oldest {
			delete(c.local, f.key)
		} else {
			kept = append(kept, f)
		}
	}
	g.finished = kept
}

// run performs the admitted creation, settles its admission and removes it
// from its table (a local one once no caller is inside the Spot's gate). If
// the creation panics, the admission is settled with creationPanicked()
// before the panic goes on.
func (c *UserSpotCoordinator) run(ctx context.Context, local bool, key string, a *admission, req RemoteCreate, materialize RemoteMaterializeFunc, discard DiscardFunc) {
	settled := false
	defer func() {
		if !settled {
			a.result, a.err = CreateResult{}, creationPanicked()
		}
		c.mu.Lock()
		table := c.remote
		if local {
			table = c.local
		}
		if table[key] == a {
			if g := c.gates[req.SpotID]; local && g != nil {
				g.finished = append(g.finished, finishedAdmission{key: key, ticket: g.issued})
			} else {
				delete(table, key)
			}
		}
		c.mu.Unlock()
		close(a.done)
	}()
	a.result, a.err = c.materializeRemoteCreate(ctx, req, materialize, discard)
	settled = true
}
