package coordinator_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/coordinator"
)

// TestScenariosMemory runs every coordinator scenario on the memory provider,
// with its change feed, without it (polling), and with reads from a local
// read view.
func TestScenariosMemory(t *testing.T) {
	t.Run("feed", func(t *testing.T) { runScenarios(t, memoryFactory) })
	t.Run("poll", func(t *testing.T) { runScenarios(t, withoutChangeFeed(memoryFactory)) })
	t.Run("view", func(t *testing.T) { runScenarios(t, withView(memoryFactory)) })
}

// runScenarios runs the User Spot and Instance scenarios against stores made
// by f. A provider plugs in with a Factory.
func runScenarios(t *testing.T, f Factory) {
	scenarios := []struct {
		name string
		run  func(t *testing.T, f Factory)
	}{
		{"ConcurrentGetOrCreate", testConcurrentGetOrCreate},
		{"CapacityFallback", testCapacityFallback},
		{"AllNodesFull", testAllNodesFull},
		{"MaterializeRejects", testMaterializeRejects},
		{"MaterializeFails", testMaterializeFails},
		{"RollbackFails", testRollbackFails},
		{"DeadlineExceeded", testDeadlineExceeded},
		{"DeadlineWhileAwaitingCreator", testDeadlineWhileAwaiting},
		{"ExistingAndIdentityConflicts", testExistingAndConflicts},
		{"InvalidRequests", testInvalidRequests},
		{"RemoteCreate", testRemoteCreate},
		{"RemoteCreateConcurrentCallers", testRemoteConcurrentCallers},
		{"RemoteCreateFailures", testRemoteCreateFailures},
		{"CloseAccepted", testCloseAccepted},
		{"CloseDeclined", testCloseDeclined},
		{"CloseFailing", testCloseFailing},
		{"CloseStaleAndHooks", testCloseStaleAndHooks},
		{"HandleRemoteClose", testHandleRemoteClose},
		{"InstanceLifecycle", testInstanceLifecycle},
		{"InstanceConcurrentJoin", testInstanceConcurrentJoin},
		{"InstanceJoinDeadline", testInstanceJoinDeadline},
		{"InstanceResumeAfterRestart", testInstanceResume},
		{"InstanceAbort", testInstanceAbort},
		{"InstanceWaitsOutClosing", testInstanceWaitsOutClosing},
		{"InstanceFailures", testInstanceFailures},
		{"OwnershipTokenHandOff", testOwnershipTokenHandOff},
	}
	for _, s := range scenarios {
		t.Run(s.name, func(t *testing.T) { s.run(t, f) })
	}
}

const stableType = "chat.Room"

func localTarget() coordinator.Target {
	return coordinator.Target{MeshName: "mesh", NodeRID: "node-a", NodeGeneration: 1, Owner: ownerA, IsLocal: true}
}

func remoteTarget() coordinator.Target {
	return coordinator.Target{MeshName: "mesh", NodeRID: "node-b", NodeGeneration: 1, Owner: ownerB}
}

// placeOn places on the first target not excluded, recording each call's
// exclusions.
type placeOn struct {
	mu       sync.Mutex
	targets  []coordinator.Target
	excluded [][]string
}

func (p *placeOn) place(_ context.Context, _ coordinator.CreateRequest, excluded map[string]bool) (coordinator.Target, bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var ex []string
	for rid := range excluded {
		ex = append(ex, rid)
	}
	p.excluded = append(p.excluded, ex)
	for _, t := range p.targets {
		if !excluded[t.NodeRID] {
			return t, true, nil
		}
	}
	return coordinator.Target{}, false, nil
}

func newCoordinator(t *testing.T, store authority.Store, opts coordinator.UserSpotOptions, targets ...coordinator.Target) (*coordinator.UserSpotCoordinator, *placeOn) {
	t.Helper()
	p := &placeOn{targets: targets}
	opts.Store = store
	if opts.Placement == nil {
		opts.Placement = p.place
	}
	c, err := coordinator.NewUserSpotCoordinator(opts)
	require.NoError(t, err)
	return c, p
}

// app counts materialize and discard calls and plays a scripted outcome.
type app struct {
	materialized atomic.Int64
	discarded    atomic.Int64
	requests     [][]byte
	mu           sync.Mutex
	outcome      func(ctx context.Context) (coordinator.Materialized, error)
	discardErr   error
	startedCh    chan struct{}
}

// started returns a channel closed once materialize first ran.
func (a *app) started() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.startedCh == nil {
		a.startedCh = make(chan struct{})
	}
	return a.startedCh
}

func (a *app) materialize(ctx context.Context, _ coordinator.Target, creating *authority.Snapshot) (coordinator.Materialized, error) {
	return a.remoteMaterialize(ctx, nil, creating)
}

func (a *app) remoteMaterialize(ctx context.Context, request []byte, creating *authority.Snapshot) (coordinator.Materialized, error) {
	a.materialized.Add(1)
	a.mu.Lock()
	a.requests = append(a.requests, bytes.Clone(request))
	if a.startedCh == nil {
		a.startedCh = make(chan struct{})
	}
	select {
	case <-a.startedCh:
	default:
		close(a.startedCh)
	}
	a.mu.Unlock()
	if p, err := coordinator.DecodePayload(creating.Payload); err != nil || p.State != coordinator.StateCreating {
		return coordinator.Materialized{}, fmt.Errorf("materialize saw a non-creating row: %+v %v", p, err)
	}
	if a.outcome != nil {
		return a.outcome(ctx)
	}
	return coordinator.Materialized{State: coordinator.Created, Reply: []byte("hello")}, nil
}

func (a *app) discard(context.Context) error {
	a.discarded.Add(1)
	return a.discardErr
}

// publication records Publish and Abort calls.
type publication struct{ published, aborted atomic.Int64 }

func (p *publication) Publish() { p.published.Add(1) }
func (p *publication) Abort()   { p.aborted.Add(1) }

func request(id string) coordinator.CreateRequest {
	return coordinator.CreateRequest{SpotID: id, StableType: stableType, RequestPayload: []byte("payload:" + id), Timeout: 10 * time.Second}
}

func requireKind(t *testing.T, err error, kind coordinator.ErrorKind) *coordinator.Error {
	t.Helper()
	require.Error(t, err)
	require.Truef(t, errors.Is(err, kind), "error %v is not %s", err, kind)
	var e *coordinator.Error
	require.True(t, errors.As(err, &e))
	return e
}

func requireMissing(t *testing.T, e *env, kind authority.ObjectKind, id string) {
	t.Helper()
	require.Equal(t, authority.KindMissing, e.read(kind, id).Kind, "row %s/%s must be gone", kind, id)
}

func requireReadyUserSpot(t *testing.T, e *env, id string) *authority.Snapshot {
	t.Helper()
	r := e.read(authority.ObjectUserSpot, id)
	require.Equal(t, authority.KindSnapshot, r.Kind)
	require.Equal(t, authority.AllocationActive, r.Snapshot.Allocation.State)
	p, err := coordinator.DecodePayload(r.Snapshot.Payload)
	require.NoError(t, err)
	require.Equal(t, coordinator.StateReady, p.State)
	require.Equal(t, id, p.SpotID)
	return r.Snapshot
}

func testConcurrentGetOrCreate(t *testing.T, f Factory) {
	e := newEnv(t, f)
	const n = 50
	store := countReserves(e.h.Store)
	var routes atomic.Int64
	c, _ := newCoordinator(t, store, coordinator.UserSpotOptions{
		PublishReadyRoute: func(string, coordinator.ReadyRoute) { routes.Add(1) },
	}, localTarget())
	everyoneReserved := store.reached(n)
	a := &app{outcome: func(ctx context.Context) (coordinator.Materialized, error) {
		// Hold the winner until every caller went through Reserve, so all
		// 49 losers meet the reservation, not the Ready row.
		select {
		case <-everyoneReserved:
		case <-ctx.Done():
			return coordinator.Materialized{}, ctx.Err()
		}
		return coordinator.Materialized{State: coordinator.Created}, nil
	}}
	results := make([]coordinator.CreateResult, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = c.GetOrCreate(e.ctx, request("spot-1"), a.materialize, a.discard)
		}()
	}
	wg.Wait()
	states := map[coordinator.CreateState]int{}
	for i := range n {
		require.NoError(t, errs[i])
		states[results[i].State]++
		require.Equal(t, results[0].Spot, results[i].Spot)
	}
	require.Equal(t, int64(1), a.materialized.Load(), "materialize runs exactly once")
	require.Equal(t, map[coordinator.CreateState]int{coordinator.Created: 1, coordinator.Existing: n - 1}, states)
	require.Equal(t, int64(0), a.discarded.Load())
	require.Equal(t, int64(1), routes.Load())
	s := requireReadyUserSpot(t, e, "spot-1")
	require.Equal(t, s.ObjectGeneration, results[0].Spot.ObjectGeneration)
	require.Equal(t, coordinator.SpotRef{SpotID: "spot-1", ObjectGeneration: s.ObjectGeneration, MeshName: "mesh", NodeRID: "node-a"}, results[0].Spot)
	require.Equal(t, authority.CapacityUsage{Active: 1}, e.usage(nodeA, authority.ObjectUserSpot, stableType))
}

func testCapacityFallback(t *testing.T, f Factory) {
	e := newEnv(t, f)
	if e.h.SetCapacityPolicy == nil {
		t.Skip("provider cannot set a capacity policy")
	}
	e.h.SetCapacityPolicy(t, spotLimits{"node-a": 0})
	second := coordinator.Target{MeshName: "mesh", NodeRID: "node-b", NodeGeneration: 1, Owner: ownerB, IsLocal: true}
	c, p := newCoordinator(t, e.h.Store, coordinator.UserSpotOptions{}, localTarget(), second)
	a := &app{}
	res, err := c.GetOrCreate(e.ctx, request("spot-1"), a.materialize, a.discard)
	require.NoError(t, err)
	require.Equal(t, coordinator.Created, res.State)
	require.Equal(t, "node-b", res.Spot.NodeRID)
	require.Equal(t, [][]string{nil, {"node-a"}}, p.excluded)
	s := requireReadyUserSpot(t, e, "spot-1")
	require.Equal(t, "node-b", s.Allocation.Descriptor.RID)
	require.Equal(t, ownerB, s.Owner())
	require.Equal(t, authority.CapacityUsage{}, e.usage(nodeA, authority.ObjectUserSpot, stableType))
}

func testAllNodesFull(t *testing.T, f Factory) {
	e := newEnv(t, f)
	if e.h.SetCapacityPolicy == nil {
		t.Skip("provider cannot set a capacity policy")
	}
	e.h.SetCapacityPolicy(t, spotLimits{"node-a": 0, "node-b": 0})
	second := coordinator.Target{MeshName: "mesh", NodeRID: "node-b", NodeGeneration: 1, Owner: ownerB, IsLocal: true}
	c, _ := newCoordinator(t, e.h.Store, coordinator.UserSpotOptions{}, localTarget(), second)
	a := &app{}
	_, err := c.GetOrCreate(e.ctx, request("spot-1"), a.materialize, a.discard)
	ce := requireKind(t, err, coordinator.KindPlacementCapacityExhausted)
	require.True(t, ce.Retryable)
	require.Equal(t, int64(0), a.materialized.Load())
	requireMissing(t, e, authority.ObjectUserSpot, "spot-1")

	// A placement provider that keeps offering an excluded node.
	sticky := func(context.Context, coordinator.CreateRequest, map[string]bool) (coordinator.Target, bool, error) {
		return localTarget(), true, nil
	}
	c2, _ := newCoordinator(t, e.h.Store, coordinator.UserSpotOptions{Placement: sticky})
	_, err = c2.GetOrCreate(e.ctx, request("spot-1"), a.materialize, a.discard)
	requireKind(t, err, coordinator.KindPlacementCapacityExhausted)

	// A failing placement provider.
	broken := func(context.Context, coordinator.CreateRequest, map[string]bool) (coordinator.Target, bool, error) {
		return coordinator.Target{}, false, errors.New("placement down")
	}
	c3, _ := newCoordinator(t, e.h.Store, coordinator.UserSpotOptions{Placement: broken})
	_, err = c3.GetOrCreate(e.ctx, request("spot-1"), a.materialize, a.discard)
	requireKind(t, err, coordinator.KindRequestFailed)
}

func testMaterializeRejects(t *testing.T, f Factory) {
	e := newEnv(t, f)
	var routes atomic.Int64
	c, _ := newCoordinator(t, e.h.Store, coordinator.UserSpotOptions{
		PublishReadyRoute: func(string, coordinator.ReadyRoute) { routes.Add(1) },
	}, localTarget())
	pub := &publication{}
	a := &app{outcome: func(context.Context) (coordinator.Materialized, error) {
		return coordinator.Materialized{State: coordinator.Rejected, Reply: []byte("no"), Publication: pub}, nil
	}}
	res, err := c.GetOrCreate(e.ctx, request("spot-1"), a.materialize, a.discard)
	require.NoError(t, err)
	require.Equal(t, coordinator.Rejected, res.State)
	require.Equal(t, []byte("no"), res.Reply)
	require.Equal(t, int64(1), a.discarded.Load())
	require.Equal(t, int64(1), pub.aborted.Load())
	require.Equal(t, int64(0), pub.published.Load())
	require.Equal(t, int64(0), routes.Load())
	requireMissing(t, e, authority.ObjectUserSpot, "spot-1")
	require.Equal(t, authority.CapacityUsage{}, e.usage(nodeA, authority.ObjectUserSpot, stableType))
}

func testMaterializeFails(t *testing.T, f Factory) {
	e := newEnv(t, f)
	c, _ := newCoordinator(t, e.h.Store, coordinator.UserSpotOptions{}, localTarget())
	boom := errors.New("materialize exploded")
	a := &app{outcome: func(context.Context) (coordinator.Materialized, error) { return coordinator.Materialized{}, boom }}
	_, err := c.GetOrCreate(e.ctx, request("spot-1"), a.materialize, a.discard)
	require.ErrorIs(t, err, boom)
	require.Equal(t, int64(1), a.discarded.Load())
	requireMissing(t, e, authority.ObjectUserSpot, "spot-1")
	require.Equal(t, authority.CapacityUsage{}, e.usage(nodeA, authority.ObjectUserSpot, stableType))

	// The Spot can be created afterwards.
	ok := &app{}
	res, err := c.GetOrCreate(e.ctx, request("spot-1"), ok.materialize, ok.discard)
	require.NoError(t, err)
	require.Equal(t, coordinator.Created, res.State)
}

func testRollbackFails(t *testing.T, f Factory) {
	e := newEnv(t, f)
	c, _ := newCoordinator(t, e.h.Store, coordinator.UserSpotOptions{CleanupTimeout: 5 * time.Second}, localTarget())
	boom := errors.New("materialize exploded")
	discardErr := errors.New("discard failed")
	a := &app{discardErr: discardErr, outcome: func(context.Context) (coordinator.Materialized, error) {
		return coordinator.Materialized{}, boom
	}}
	_, err := c.GetOrCreate(e.ctx, request("spot-1"), a.materialize, a.discard)
	var rb *coordinator.RollbackError
	require.ErrorAs(t, err, &rb)
	require.ErrorIs(t, err, boom)
	require.ErrorIs(t, err, discardErr)
	require.Equal(t, []error{discardErr}, rb.Cleanup)
	requireMissing(t, e, authority.ObjectUserSpot, "spot-1")

	// Rejected, then discard fails: the rollback runs again (abort is
	// idempotent) and the discard failure is reported.
	pub := &publication{}
	r := &app{discardErr: discardErr, outcome: func(context.Context) (coordinator.Materialized, error) {
		return coordinator.Materialized{State: coordinator.Rejected, Publication: pub}, nil
	}}
	_, err = c.GetOrCreate(e.ctx, request("spot-2"), r.materialize, r.discard)
	require.ErrorIs(t, err, discardErr)
	require.Equal(t, int64(2), r.discarded.Load())
	require.Equal(t, int64(1), pub.aborted.Load())
	requireMissing(t, e, authority.ObjectUserSpot, "spot-2")
}

func testDeadlineExceeded(t *testing.T, f Factory) {
	e := newEnv(t, f)
	c, _ := newCoordinator(t, e.h.Store, coordinator.UserSpotOptions{}, localTarget())
	a := &app{outcome: func(ctx context.Context) (coordinator.Materialized, error) {
		<-ctx.Done()
		return coordinator.Materialized{}, ctx.Err()
	}}
	req := request("spot-1")
	req.Timeout = 300 * time.Millisecond // long enough for the reservation to land on a real server with fsync
	_, err := c.GetOrCreate(e.ctx, req, a.materialize, a.discard)
	ce := requireKind(t, err, coordinator.KindDeadlineExceeded)
	require.True(t, ce.Retryable)
	require.True(t, coordinator.IsRetryable(err))
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Equal(t, int64(1), a.discarded.Load())
	requireMissing(t, e, authority.ObjectUserSpot, "spot-1")
	require.Equal(t, authority.CapacityUsage{}, e.usage(nodeA, authority.ObjectUserSpot, stableType))

	// An already expired context.
	ctx, cancel := context.WithDeadline(e.ctx, time.Now().Add(-time.Second))
	defer cancel()
	_, err = c.GetOrCreate(ctx, request("spot-1"), a.materialize, a.discard)
	requireKind(t, err, coordinator.KindDeadlineExceeded)
	requireMissing(t, e, authority.ObjectUserSpot, "spot-1")
}

func testDeadlineWhileAwaiting(t *testing.T, f Factory) {
	e := newEnv(t, f)
	c, _ := newCoordinator(t, e.h.Store, coordinator.UserSpotOptions{}, localTarget())
	release := make(chan struct{})
	started := make(chan struct{})
	a := &app{outcome: func(ctx context.Context) (coordinator.Materialized, error) {
		close(started)
		<-release
		return coordinator.Materialized{State: coordinator.Created}, nil
	}}
	done := make(chan error, 1)
	go func() {
		_, err := c.GetOrCreate(e.ctx, request("spot-1"), a.materialize, a.discard)
		done <- err
	}()
	<-started
	// A second coordinator (no shared admission) waits for the Ready row.
	c2, _ := newCoordinator(t, e.h.Store, coordinator.UserSpotOptions{}, localTarget())
	req := request("spot-1")
	req.Timeout = 20 * time.Millisecond
	_, err := c2.GetOrCreate(e.ctx, req, a.materialize, a.discard)
	requireKind(t, err, coordinator.KindDeadlineExceeded)
	// The same coordinator joins the admission and gives up at its deadline.
	_, err = c.GetOrCreate(e.ctx, req, a.materialize, a.discard)
	requireKind(t, err, coordinator.KindDeadlineExceeded)
	close(release)
	require.NoError(t, <-done)
	require.Equal(t, int64(1), a.materialized.Load())
	// Once Ready, the second coordinator sees it.
	res, err := c2.GetOrCreate(e.ctx, request("spot-1"), a.materialize, a.discard)
	require.NoError(t, err)
	require.Equal(t, coordinator.Existing, res.State)
}

func testExistingAndConflicts(t *testing.T, f Factory) {
	e := newEnv(t, f)
	c, _ := newCoordinator(t, e.h.Store, coordinator.UserSpotOptions{}, localTarget())
	a := &app{}
	created, err := c.GetOrCreate(e.ctx, request("spot-1"), a.materialize, a.discard)
	require.NoError(t, err)
	require.Equal(t, []byte("hello"), created.Reply)

	again, err := c.GetOrCreate(e.ctx, request("spot-1"), a.materialize, a.discard)
	require.NoError(t, err)
	require.Equal(t, coordinator.Existing, again.State)
	require.Equal(t, created.Spot, again.Spot)

	gen := request("spot-1")
	gen.GeneratedIdentity = true
	_, err = c.GetOrCreate(e.ctx, gen, a.materialize, a.discard)
	requireKind(t, err, coordinator.KindSpotIDConflict)

	other := request("spot-1")
	other.StableType = "other.Type"
	_, err = c.GetOrCreate(e.ctx, other, a.materialize, a.discard)
	requireKind(t, err, coordinator.KindSpotTypeMismatch)
	other.GeneratedIdentity = true
	_, err = c.GetOrCreate(e.ctx, other, a.materialize, a.discard)
	requireKind(t, err, coordinator.KindSpotIDConflict)
	require.Equal(t, int64(1), a.materialized.Load())

	// A reservation held for another target needs a fenced remote create.
	release := make(chan struct{})
	started := make(chan struct{})
	slow := &app{outcome: func(context.Context) (coordinator.Materialized, error) {
		close(started)
		<-release
		return coordinator.Materialized{State: coordinator.Created}, nil
	}}
	done := make(chan error, 1)
	go func() {
		_, err := c.GetOrCreate(e.ctx, request("spot-2"), slow.materialize, slow.discard)
		done <- err
	}()
	<-started
	onB := coordinator.Target{MeshName: "mesh", NodeRID: "node-b", NodeGeneration: 1, Owner: ownerB, IsLocal: true}
	cb, _ := newCoordinator(t, e.h.Store, coordinator.UserSpotOptions{}, onB)
	_, err = cb.GetOrCreate(e.ctx, request("spot-2"), a.materialize, a.discard)
	requireKind(t, err, coordinator.KindRequestFailed)
	gen2 := request("spot-2")
	gen2.GeneratedIdentity = true
	_, err = cb.GetOrCreate(e.ctx, gen2, a.materialize, a.discard)
	requireKind(t, err, coordinator.KindSpotIDConflict)
	close(release)
	require.NoError(t, <-done)

	// A dead target owner: the store answers conflict with no row.
	e.h.SetLive(t, nodeA, 1, ownerA, false)
	_, err = c.GetOrCreate(e.ctx, request("spot-3"), a.materialize, a.discard)
	requireKind(t, err, coordinator.KindRequestFailed)
	requireMissing(t, e, authority.ObjectUserSpot, "spot-3")
}

func testInvalidRequests(t *testing.T, f Factory) {
	e := newEnv(t, f)
	c, _ := newCoordinator(t, e.h.Store, coordinator.UserSpotOptions{}, localTarget())
	a := &app{}
	for name, req := range map[string]coordinator.CreateRequest{
		"empty spot":   {StableType: stableType, Timeout: time.Second},
		"empty type":   {SpotID: "s", Timeout: time.Second},
		"huge payload": {SpotID: "s", StableType: stableType, RequestPayload: make([]byte, authority.MaxPayloadBytes+1), Timeout: time.Second},
		"no deadline":  {SpotID: "s", StableType: stableType},
	} {
		_, err := c.GetOrCreate(e.ctx, req, a.materialize, a.discard)
		require.ErrorIs(t, err, authority.ErrInvalidArgument, name)
	}
	_, err := c.GetOrCreate(e.ctx, request("s"), nil, a.discard)
	require.ErrorIs(t, err, authority.ErrInvalidArgument)
	requireMissing(t, e, authority.ObjectUserSpot, "s")
	_, err = coordinator.NewUserSpotCoordinator(coordinator.UserSpotOptions{})
	require.ErrorIs(t, err, authority.ErrInvalidArgument)
	// A placement target the payload codec refuses (no mesh name).
	bad := localTarget()
	bad.MeshName = ""
	cb, _ := newCoordinator(t, e.h.Store, coordinator.UserSpotOptions{}, bad)
	_, err = cb.GetOrCreate(e.ctx, request("s"), a.materialize, a.discard)
	require.ErrorIs(t, err, authority.ErrInvalidArgument)
	requireMissing(t, e, authority.ObjectUserSpot, "s")
}

// remotePair is two coordinators sharing one store: A on node-a places on
// node-b, and its transport delivers every request to B twice (a duplicate
// delivery).
type remotePair struct {
	a, b       *coordinator.UserSpotCoordinator
	app        *app
	deliveries atomic.Int64
	duplicates chan error
}

func newRemotePair(t *testing.T, e *env, remoteApp *app) *remotePair {
	p := &remotePair{app: remoteApp, duplicates: make(chan error, 16)}
	p.b, _ = newCoordinator(t, e.h.Store, coordinator.UserSpotOptions{NodeRID: "node-b", NodeGeneration: 1})
	transport := coordinator.TransportFunc(func(ctx context.Context, mesh, rid string, req coordinator.RemoteCreate) (coordinator.RemoteReply, error) {
		if mesh != "mesh" || rid != "node-b" {
			return coordinator.RemoteReply{}, fmt.Errorf("no route to %s/%s", mesh, rid)
		}
		p.deliveries.Add(2)
		// The primary delivery goes first; the duplicate follows once the
		// target runs materialize (or the primary ended), so it either
		// shares the in-flight creation or meets its outcome in the store.
		type outcome struct {
			res coordinator.CreateResult
			err error
		}
		primary := make(chan outcome, 1)
		go func() {
			res, err := p.b.HandleRemoteCreate(ctx, req, remoteApp.remoteMaterialize, remoteApp.discard)
			primary <- outcome{res, err}
		}()
		var first *outcome
		select {
		case <-remoteApp.started():
		case o := <-primary:
			first = &o
		}
		_, dupErr := p.b.HandleRemoteCreate(ctx, req, remoteApp.remoteMaterialize, remoteApp.discard)
		p.duplicates <- dupErr
		if first == nil {
			o := <-primary
			first = &o
		}
		res, err := first.res, first.err
		if err != nil {
			return coordinator.RemoteReply{}, err
		}
		return res.RemoteReply(), nil
	})
	p.a, _ = newCoordinator(t, e.h.Store, coordinator.UserSpotOptions{Transport: transport, NodeRID: "node-a", NodeGeneration: 1}, remoteTarget())
	return p
}

func testRemoteCreate(t *testing.T, f Factory) {
	e := newEnv(t, f)
	remoteApp := &app{}
	p := newRemotePair(t, e, remoteApp)
	local := &app{}
	req := request("spot-1")
	res, err := p.a.GetOrCreate(e.ctx, req, local.materialize, local.discard)
	require.NoError(t, err)
	require.NoError(t, <-p.duplicates)
	require.Equal(t, coordinator.Created, res.State)
	require.Equal(t, []byte("hello"), res.Reply)
	require.Equal(t, "node-b", res.Spot.NodeRID)
	require.Equal(t, int64(0), local.materialized.Load(), "the source never materializes a remote Spot")
	require.Equal(t, int64(1), remoteApp.materialized.Load(), "duplicate delivery materializes once")
	require.Equal(t, int64(2), p.deliveries.Load())
	require.Equal(t, [][]byte{req.RequestPayload}, remoteApp.requests, "the target receives the verified request payload")
	s := requireReadyUserSpot(t, e, "spot-1")
	require.Equal(t, ownerB, s.Owner())
	require.Equal(t, s.ObjectGeneration, res.Spot.ObjectGeneration)

	again, err := p.a.GetOrCreate(e.ctx, req, local.materialize, local.discard)
	require.NoError(t, err)
	require.Equal(t, coordinator.Existing, again.State)
	require.Equal(t, res.Spot, again.Spot)
}

func testRemoteConcurrentCallers(t *testing.T, f Factory) {
	e := newEnv(t, f)
	store := countReserves(e.h.Store)
	const n = 8
	everyoneReserved := store.reached(n)
	remoteApp := &app{outcome: func(ctx context.Context) (coordinator.Materialized, error) {
		select {
		case <-everyoneReserved:
		case <-ctx.Done():
			return coordinator.Materialized{}, ctx.Err()
		}
		return coordinator.Materialized{State: coordinator.Created}, nil
	}}
	se := &env{t: t, h: &Harness{Store: store}, ctx: e.ctx}
	p := newRemotePair(t, se, remoteApp)
	var wg sync.WaitGroup
	results := make([]coordinator.CreateResult, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = p.a.GetOrCreate(e.ctx, request("spot-1"), nil2(), nil)
		}()
	}
	wg.Wait()
	states := map[coordinator.CreateState]int{}
	for i := range n {
		require.NoError(t, errs[i])
		states[results[i].State]++
	}
	// Every caller met the same reservation and sent the same fenced remote
	// create: the target de-duplicated them all into one materialize.
	require.Equal(t, int64(1), remoteApp.materialized.Load())
	require.Equal(t, n, states[coordinator.Created]+states[coordinator.Existing])
	require.GreaterOrEqual(t, states[coordinator.Created], 1)
	requireReadyUserSpot(t, e, "spot-1")
	for range p.deliveries.Load() / 2 {
		require.NoError(t, <-p.duplicates)
	}
}

// nil2 is a materialize that must never run.
func nil2() coordinator.MaterializeFunc {
	return func(context.Context, coordinator.Target, *authority.Snapshot) (coordinator.Materialized, error) {
		return coordinator.Materialized{}, errors.New("local materialize must not run for a remote target")
	}
}

func testRemoteCreateFailures(t *testing.T, f Factory) {
	e := newEnv(t, f)
	a := &app{}

	// No transport.
	c, _ := newCoordinator(t, e.h.Store, coordinator.UserSpotOptions{}, remoteTarget())
	_, err := c.GetOrCreate(e.ctx, request("spot-1"), a.materialize, a.discard)
	requireKind(t, err, coordinator.KindRequestFailed)

	// A failing transport.
	down := coordinator.TransportFunc(func(context.Context, string, string, coordinator.RemoteCreate) (coordinator.RemoteReply, error) {
		return coordinator.RemoteReply{}, errors.New("connection refused")
	})
	c, _ = newCoordinator(t, e.h.Store, coordinator.UserSpotOptions{Transport: down}, remoteTarget())
	_, err = c.GetOrCreate(e.ctx, request("spot-2"), a.materialize, a.discard)
	requireKind(t, err, coordinator.KindRequestFailed)

	// The remote owner rejects: the target aborts, discards and replies
	// Rejected.
	rejecting := &app{outcome: func(context.Context) (coordinator.Materialized, error) {
		return coordinator.Materialized{State: coordinator.Rejected}, nil
	}}
	p := newRemotePair(t, e, rejecting)
	res, err := p.a.GetOrCreate(e.ctx, request("spot-3"), a.materialize, a.discard)
	require.NoError(t, err)
	requireDuplicateOutcome(t, <-p.duplicates)
	require.Equal(t, coordinator.Rejected, res.State)
	require.Equal(t, int64(1), rejecting.discarded.Load())
	requireMissing(t, e, authority.ObjectUserSpot, "spot-3")

	// The remote owner fails: the typed failure crosses the transport.
	failing := &app{outcome: func(context.Context) (coordinator.Materialized, error) {
		return coordinator.Materialized{}, &coordinator.Error{Kind: coordinator.KindSpotMoving, Message: "owner moving", Retryable: true}
	}}
	p = newRemotePair(t, e, failing)
	_, err = p.a.GetOrCreate(e.ctx, request("spot-4"), a.materialize, a.discard)
	requireKind(t, err, coordinator.KindSpotMoving)
	requireDuplicateOutcome(t, <-p.duplicates)
	requireMissing(t, e, authority.ObjectUserSpot, "spot-4")
	require.Equal(t, int64(1), failing.materialized.Load())

	// Deliveries that do not match the reservation.
	gate := make(chan struct{})
	started := make(chan struct{})
	slow := &app{outcome: func(context.Context) (coordinator.Materialized, error) {
		close(started)
		<-gate
		return coordinator.Materialized{State: coordinator.Created}, nil
	}}
	var captured coordinator.RemoteCreate
	var b *coordinator.UserSpotCoordinator
	b, _ = newCoordinator(t, e.h.Store, coordinator.UserSpotOptions{})
	capture := coordinator.TransportFunc(func(ctx context.Context, _, _ string, req coordinator.RemoteCreate) (coordinator.RemoteReply, error) {
		captured = req
		res, err := b.HandleRemoteCreate(ctx, req, slow.remoteMaterialize, slow.discard)
		return res.RemoteReply(), err
	})
	src, _ := newCoordinator(t, e.h.Store, coordinator.UserSpotOptions{Transport: capture}, remoteTarget())
	done := make(chan error, 1)
	go func() {
		_, err := src.GetOrCreate(e.ctx, request("spot-5"), a.materialize, a.discard)
		done <- err
	}()
	<-started
	reused := captured
	reused.StableType = "other.Type"
	_, err = b.HandleRemoteCreate(e.ctx, reused, slow.remoteMaterialize, slow.discard)
	requireKind(t, err, coordinator.KindRequestFailed) // same reservation, other content
	close(gate)
	require.NoError(t, <-done)
	// After Ready, a late duplicate answers Existing without materializing.
	late, err := b.HandleRemoteCreate(e.ctx, captured, slow.remoteMaterialize, slow.discard)
	require.NoError(t, err)
	require.Equal(t, coordinator.Existing, late.State)
	require.Equal(t, int64(1), slow.materialized.Load())
	// A fence for another generation is stale.
	stale := captured
	stale.Reservation.ObjectGeneration++
	_, err = b.HandleRemoteCreate(e.ctx, stale, slow.remoteMaterialize, slow.discard)
	requireKind(t, err, coordinator.KindSpotMoving)
	_, err = b.HandleRemoteCreate(e.ctx, captured, nil, nil)
	require.ErrorIs(t, err, authority.ErrInvalidArgument)
}

func createSpot(t *testing.T, e *env, c *coordinator.UserSpotCoordinator, id string) coordinator.SpotRef {
	t.Helper()
	a := &app{}
	res, err := c.GetOrCreate(e.ctx, request(id), a.materialize, a.discard)
	require.NoError(t, err)
	require.Equal(t, coordinator.Created, res.State)
	return res.Spot
}

func testCloseAccepted(t *testing.T, f Factory) {
	e := newEnv(t, f)
	var forgotten []coordinator.ReadyRoute
	c, _ := newCoordinator(t, e.h.Store, coordinator.UserSpotOptions{
		ForgetReadyRoute: func(mesh string, r coordinator.ReadyRoute) { forgotten = append(forgotten, r) },
	}, localTarget())
	spot := createSpot(t, e, c, "spot-1")
	ready := requireReadyUserSpot(t, e, "spot-1")
	var sawState coordinator.State
	closed, err := c.Close(e.ctx, spot, func(_ context.Context, cur coordinator.SpotRef, closing *authority.Snapshot) (bool, error) {
		p, err := coordinator.DecodePayload(closing.Payload)
		require.NoError(t, err)
		sawState = p.State
		require.Equal(t, spot, cur)
		return true, nil
	}, coordinator.CloseHooks{})
	require.NoError(t, err)
	require.True(t, closed)
	require.Equal(t, coordinator.StateClosing, sawState)
	requireMissing(t, e, authority.ObjectUserSpot, "spot-1")
	require.Len(t, forgotten, 1)
	require.Equal(t, ready.ObjectGeneration, forgotten[0].Generation)
	require.Equal(t, authority.CapacityUsage{}, e.usage(nodeA, authority.ObjectUserSpot, stableType))

	// Closing a Spot that is gone.
	closed, err = c.Close(e.ctx, spot, func(context.Context, coordinator.SpotRef, *authority.Snapshot) (bool, error) {
		t.Fatal("closeOwner must not run")
		return false, nil
	}, coordinator.CloseHooks{})
	require.NoError(t, err)
	require.False(t, closed)
	_, err = c.Close(e.ctx, spot, nil, coordinator.CloseHooks{})
	require.ErrorIs(t, err, authority.ErrInvalidArgument)
}

func testCloseDeclined(t *testing.T, f Factory) {
	e := newEnv(t, f)
	c, _ := newCoordinator(t, e.h.Store, coordinator.UserSpotOptions{}, localTarget())
	spot := createSpot(t, e, c, "spot-1")
	before := requireReadyUserSpot(t, e, "spot-1")
	closed, err := c.Close(e.ctx, spot, func(context.Context, coordinator.SpotRef, *authority.Snapshot) (bool, error) {
		return false, nil
	}, coordinator.CloseHooks{})
	require.NoError(t, err)
	require.False(t, closed)
	after := requireReadyUserSpot(t, e, "spot-1")
	require.NotEqual(t, before.StoreVersion, after.StoreVersion, "Ready was restored by a new write")
	require.Equal(t, before.ObjectGeneration, after.ObjectGeneration)
	require.Equal(t, before.Payload, after.Payload)
}

func testCloseFailing(t *testing.T, f Factory) {
	e := newEnv(t, f)
	c, _ := newCoordinator(t, e.h.Store, coordinator.UserSpotOptions{}, localTarget())
	spot := createSpot(t, e, c, "spot-1")
	boom := errors.New("owner close failed")
	_, err := c.Close(e.ctx, spot, func(context.Context, coordinator.SpotRef, *authority.Snapshot) (bool, error) {
		return false, boom
	}, coordinator.CloseHooks{})
	require.ErrorIs(t, err, boom)
	requireReadyUserSpot(t, e, "spot-1")

	// The row changes while the owner closes: restoring Ready fails.
	key, _ := authority.EncodeKey(authority.ObjectUserSpot, "spot-1")
	_, err = c.Close(e.ctx, spot, func(ctx context.Context, _ coordinator.SpotRef, closing *authority.Snapshot) (bool, error) {
		_, err := e.h.Store.CompareExchangeAuthority(ctx, key, closing.StoreVersion, authority.Put(closing.Payload))
		require.NoError(t, err)
		return false, nil
	}, coordinator.CloseHooks{})
	requireKind(t, err, coordinator.KindSpotMoving)
	_, err = c.Close(e.ctx, spot, func(ctx context.Context, _ coordinator.SpotRef, closing *authority.Snapshot) (bool, error) {
		return false, boom
	}, coordinator.CloseHooks{})
	// The row is Closing, not Ready: it no longer resolves as a Ready Spot.
	requireKind(t, err, coordinator.KindRequestFailed)
}

// requireDuplicateOutcome checks a duplicate delivery of a creation that did
// not end Ready: it shared the first delivery's outcome (the failure kind
// is not asserted), or arrived after the rollback and found the fence stale.
func requireDuplicateOutcome(t *testing.T, err error) {
	t.Helper()
	if err != nil && !errors.Is(err, coordinator.KindSpotMoving) {
		t.Fatalf("duplicate delivery: %v", err)
	}
}

func testCloseStaleAndHooks(t *testing.T, f Factory) {
	e := newEnv(t, f)
	c, _ := newCoordinator(t, e.h.Store, coordinator.UserSpotOptions{}, localTarget())
	spot := createSpot(t, e, c, "spot-1")
	never := func(context.Context, coordinator.SpotRef, *authority.Snapshot) (bool, error) {
		t.Fatal("closeOwner must not run")
		return false, nil
	}
	stale := spot
	stale.ObjectGeneration++
	_, err := c.Close(e.ctx, stale, never, coordinator.CloseHooks{})
	requireKind(t, err, coordinator.KindSpotGenerationStale)
	moved := spot
	moved.NodeRID = "node-b"
	_, err = c.Close(e.ctx, moved, never, coordinator.CloseHooks{})
	requireKind(t, err, coordinator.KindSpotGenerationStale)

	_, err = c.Close(e.ctx, spot, never, coordinator.CloseHooks{OwnerPresent: func(coordinator.SpotRef) bool { return false }})
	ce := requireKind(t, err, coordinator.KindSpotMoving)
	require.True(t, ce.Retryable)
	closed, err := c.Close(e.ctx, spot, never, coordinator.CloseHooks{
		OwnerPresent:  func(coordinator.SpotRef) bool { return true },
		OwnerCanClose: func(coordinator.SpotRef) bool { return false },
	})
	require.NoError(t, err)
	require.False(t, closed)

	// The owner's lease is gone: the row cannot enter Closing.
	e.h.SetLive(t, nodeA, 1, ownerA, false)
	_, err = c.Close(e.ctx, spot, never, coordinator.CloseHooks{})
	requireKind(t, err, coordinator.KindSpotMoving)
	// The owner dies while closing: the delete is refused.
	e.h.SetLive(t, nodeA, 1, ownerA, true)
	_, err = c.Close(e.ctx, spot, func(context.Context, coordinator.SpotRef, *authority.Snapshot) (bool, error) {
		e.h.SetLive(t, nodeA, 1, ownerA, false)
		return true, nil
	}, coordinator.CloseHooks{})
	requireKind(t, err, coordinator.KindSpotMoving)
}

func testHandleRemoteClose(t *testing.T, f Factory) {
	e := newEnv(t, f)
	var forgotten atomic.Int64
	c, _ := newCoordinator(t, e.h.Store, coordinator.UserSpotOptions{
		ForgetReadyRoute: func(string, coordinator.ReadyRoute) { forgotten.Add(1) },
	}, localTarget())
	createSpot(t, e, c, "spot-1")
	s := requireReadyUserSpot(t, e, "spot-1")
	req := coordinator.RemoteClose{
		SpotID: "spot-1", ObjectGeneration: s.ObjectGeneration, AuthorityOwnerGeneration: s.AuthorityOwnerGeneration,
		ExpectedStoreVersion: s.StoreVersion, TargetNodeRID: "node-a", TargetNodeGeneration: 1,
	}
	accept := func(context.Context, coordinator.SpotRef) (bool, error) { return true, nil }
	decline := func(context.Context, coordinator.SpotRef) (bool, error) { return false, nil }
	boom := errors.New("close failed")
	fail := func(context.Context, coordinator.SpotRef) (bool, error) { return false, boom }

	stale := req
	stale.ObjectGeneration++
	_, err := c.HandleRemoteClose(e.ctx, stale, accept)
	requireKind(t, err, coordinator.KindSpotGenerationStale)

	closed, err := c.HandleRemoteClose(e.ctx, req, decline)
	require.NoError(t, err)
	require.False(t, closed)
	// Declining restored Ready with a new version: the old fence is moving.
	_, err = c.HandleRemoteClose(e.ctx, req, accept)
	requireKind(t, err, coordinator.KindSpotMoving)

	s = requireReadyUserSpot(t, e, "spot-1")
	req.ExpectedStoreVersion = s.StoreVersion
	_, err = c.HandleRemoteClose(e.ctx, req, fail)
	require.ErrorIs(t, err, boom)
	s = requireReadyUserSpot(t, e, "spot-1")
	req.ExpectedStoreVersion = s.StoreVersion
	closed, err = c.HandleRemoteClose(e.ctx, req, accept)
	require.NoError(t, err)
	require.True(t, closed)
	require.Equal(t, int64(1), forgotten.Load())
	requireMissing(t, e, authority.ObjectUserSpot, "spot-1")
	closed, err = c.HandleRemoteClose(e.ctx, req, accept)
	require.NoError(t, err)
	require.False(t, closed)
	_, err = c.HandleRemoteClose(e.ctx, req, nil)
	require.ErrorIs(t, err, authority.ErrInvalidArgument)
}
