package coordinator

import (
	"context"
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

// errCreationPanicked settles the admission of a creation whose materialize,
// hook or publication panicked (the panic itself goes on in the caller that
// ran it).
var errCreationPanicked = newError(KindRequestFailed, "User Spot creation panicked; its reservation was rolled back.", false, nil)

// spotGate serializes, for one User Spot, the local reservations of one
// coordinator from before their Reserve until the winner's admission is
// registered (or the loser has looked it up). In the seed a single JS thread
// makes that step atomic; without it a loser could look for the winner's
// admission before it exists, or after it was removed, and wait for a Ready
// row that a rejected creation never writes.
type spotGate struct {
	token chan struct{} // holds one value while a caller is inside
	refs  int           // callers inside or waiting
	// finished are local admissions (by reservation ID) settled while the
	// gate was in use: they are removed when the last caller leaves, so a
	// loser that reserved while they ran still finds them.
	finished []string
}

// lockSpot enters spotID's gate. The returned unlock may be called more than
// once; only the first call leaves.
func (c *UserSpotCoordinator) lockSpot(ctx context.Context, spotID string) (unlock func(), err error) {
	c.mu.Lock()
	g := c.gates[spotID]
	if g == nil {
		g = &spotGate{token: make(chan struct{}, 1)}
		c.gates[spotID] = g
	}
	g.refs++
	c.mu.Unlock()
	select {
	case g.token <- struct{}{}:
	case <-ctx.Done():
		c.leaveGate(spotID, g)
		return nil, ctx.Err()
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			<-g.token
			c.leaveGate(spotID, g)
		})
	}, nil
}

func (c *UserSpotCoordinator) leaveGate(spotID string, g *spotGate) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if g.refs--; g.refs > 0 {
		return
	}
	for _, key := range g.finished {
		delete(c.local, key)
	}
	delete(c.gates, spotID)
}

// run performs the admitted creation, settles its admission and removes it
// from its table (a local one once no caller is inside the Spot's gate). If
// the creation panics, the admission is settled with errCreationPanicked
// before the panic goes on.
func (c *UserSpotCoordinator) run(ctx context.Context, local bool, key string, a *admission, req RemoteCreate, materialize RemoteMaterializeFunc, discard DiscardFunc) {
	settled := false
	defer func() {
		if !settled {
			a.result, a.err = CreateResult{}, errCreationPanicked
		}
		c.mu.Lock()
		table := c.remote
		if local {
			table = c.local
		}
		if table[key] == a {
			if g := c.gates[req.SpotID]; local && g != nil {
				g.finished = append(g.finished, key)
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
