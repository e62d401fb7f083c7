package conformance

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	authority "github.com/zlink-systems/authority"
)

// RunTestOwnershipToken checks Snapshot.OwnershipToken, the fencing token of
// a row: positive, changed exactly when the owner ID or the lease generation
// changes (rebind, aggregate move to another owner, re-create after a
// remove: strictly greater than every earlier token of the key), equal
// across every other write (also an aggregate newOwner transition to the
// row's current owner), and the same in the results that grant ownership as
// in the rows read afterwards.
func RunTestOwnershipToken(ctx context.Context, t *testing.T, f Factory) {
	runSubtests(ctx, t, f, []subtest{
		{"KeptByWritesOfTheSameOwner", testTokenKept},
		{"RaisedByRebindMoveAndRecreate", testTokenRaised},
		{"KeptByNewOwnerTransitionToTheCurrentOwner", testTokenKeptBySelfMove},
		{"RandomOperationSequences", testTokenProperty},
	})
}

func testTokenKept(t *testing.T, fx *Fixture) {
	r := fx.Reserve(authority.ObjectUserSpot, "kept", TargetA)
	tok := r.Res.Creating.OwnershipToken
	require.Positive(t, tok)
	ready := fx.MustCommit(r, []byte("ready"))
	require.Equal(t, tok, ready.OwnershipToken, "commit")
	put := fx.Put(r.Key, ready.StoreVersion, []byte("put"))
	require.Equal(t, tok, put.OwnershipToken, "put")
	res, err := fx.Store().CompareExchangeAuthority(fx.Ctx(), r.Key, put.StoreVersion, authority.Restore(OwnerA, []byte("restored")))
	require.NoError(t, err)
	require.Equal(t, authority.KindStored, res.Kind)
	require.Equal(t, tok, res.Snapshot.OwnershipToken, "restore")
	require.Equal(t, tok, fx.MustRow(r.Key).OwnershipToken, "read")

	// an aggregate that keeps the row where it is (moving another one in)
	mover := fx.Active(authority.ObjectUserSpot, "kept-mover", TargetB)
	moverKey := fx.Key(authority.ObjectUserSpot, "kept-mover")
	cur := fx.MustRow(r.Key)
	move := AggregateRequest("agg-kept", 1, TargetA, Capacity(authority.ObjectUserSpot, DefaultStableType),
		Participant(r.Key, cur.StoreVersion, authority.TransitionPreserve, []byte("kept")),
		Participant(moverKey, mover.StoreVersion, authority.TransitionNewOwner, []byte("moved in")))
	committed, err := fx.Store().CommitAggregate(fx.Ctx(), fx.MustPrepare(move))
	require.NoError(t, err)
	require.Equal(t, authority.KindCommitted, committed.Kind)
	require.Equal(t, tok, fx.MustRow(r.Key).OwnershipToken, "aggregate preserve")
	require.Equal(t, map[authority.Key]int64{moverKey: fx.MustRow(moverKey).OwnershipToken}, committed.OwnershipTokens,
		"only the moved participant is listed")
}

// testTokenKeptBySelfMove commits a newOwner transition whose target is the
// row's owner already (same owner ID and lease generation, another node): the
// owner did not change, so neither does the token, and the commit lists it.
func testTokenKeptBySelfMove(t *testing.T, fx *Fixture) {
	a := fx.Active(authority.ObjectActor, "self-move", TargetA)
	key := fx.Key(authority.ObjectActor, "self-move")
	to := Target(NodeB, NodeLifecycle, OwnerA)
	fx.SetLive(to, true)
	move := AggregateRequest("agg-self", 1, to, Capacity(authority.ObjectActor, DefaultStableType),
		Participant(key, a.StoreVersion, authority.TransitionNewOwner, []byte("self")))
	committed, err := fx.Store().CommitAggregate(fx.Ctx(), fx.MustPrepare(move))
	require.NoError(t, err)
	require.Equal(t, authority.KindCommitted, committed.Kind)
	moved := fx.MustRow(key)
	require.Equal(t, NodeB, moved.Allocation.Descriptor, "the row moved to the target node")
	require.Equal(t, a.OwnershipToken, moved.OwnershipToken, "same owner and lease: same token")
	require.Equal(t, map[authority.Key]int64{key: a.OwnershipToken}, committed.OwnershipTokens)
}

func testTokenRaised(t *testing.T, fx *Fixture) {
	a := fx.Active(authority.ObjectActor, "raised", TargetA)
	key := fx.Key(authority.ObjectActor, "raised")
	next := Target(NodeA, NodeLifecycle, authority.OwnerToken{OwnerID: OwnerA.OwnerID, LeaseGeneration: OwnerA.LeaseGeneration + 1})
	fx.SetLive(next, true)
	res, err := fx.Store().CompareExchangeAuthority(fx.Ctx(), key, a.StoreVersion, authority.RebindOwnerLease(OwnerA, next.Owner, []byte("rebound")))
	require.NoError(t, err)
	require.Equal(t, authority.KindStored, res.Kind)
	rebound := res.Snapshot.OwnershipToken
	require.Greater(t, rebound, a.OwnershipToken, "rebind to a new lease")
	require.Equal(t, a.AuthorityOwnerGeneration, res.Snapshot.AuthorityOwnerGeneration, "a rebind keeps the owner generation")

	move := AggregateRequest("agg-raised", 1, TargetB, Capacity(authority.ObjectActor, DefaultStableType),
		Participant(key, res.Snapshot.StoreVersion, authority.TransitionNewOwner, []byte("moved")))
	committed, err := fx.Store().CommitAggregate(fx.Ctx(), fx.MustPrepare(move))
	require.NoError(t, err)
	require.Equal(t, authority.KindCommitted, committed.Kind)
	moved := fx.MustRow(key)
	require.Greater(t, moved.OwnershipToken, rebound, "aggregate move to a new owner")
	require.Equal(t, map[authority.Key]int64{key: moved.OwnershipToken}, committed.OwnershipTokens)

	fx.Delete(key, moved.StoreVersion)
	again := fx.Reserve(authority.ObjectActor, "raised", TargetB)
	require.Greater(t, again.Res.Creating.OwnershipToken, moved.OwnershipToken, "re-created by the same owner")
}

// tokenModel is what the random sequences know of their one key.
type tokenModel struct {
	fx     *Fixture
	key    authority.Key
	id     string
	leases map[string]int64 // owner ID → its current lease generation
	res    *Reservation     // the open reservation, if the row is reserved
	last   *authority.Snapshot
	max    int64 // the highest token the key has shown
	moves  int
}

// testTokenProperty runs random operation sequences on one fresh key each
// and checks, after every step, the token of the row read back against the
// one before.
func testTokenProperty(t *testing.T, fx *Fixture) {
	rapid.Check(t, func(rt *rapid.T) {
		m := &tokenModel{fx: fx, id: fmt.Sprintf("prop-%d", fx.Next()), leases: map[string]int64{
			OwnerA.OwnerID: OwnerA.LeaseGeneration, OwnerB.OwnerID: OwnerB.LeaseGeneration}}
		m.key = fx.Key(authority.ObjectUserSpot, m.id)
		steps := rapid.IntRange(1, 14).Draw(rt, "steps")
		for range steps {
			op := rapid.SampledFrom([]string{"reserve", "commit", "abort", "put", "restore", "rebind", "delete", "move", "self", "keep"}).Draw(rt, "op")
			got := m.step(rt, op)
			m.check(rt, op, got)
		}
	})
}

// step runs op when the row's state allows it (otherwise nothing) and
// returns the token its result granted or kept (0 when it returned none).
func (m *tokenModel) step(rt *rapid.T, op string) int64 {
	fx, ctx, st := m.fx, m.fx.Ctx(), m.fx.Store()
	active := m.last != nil && m.res == nil
	switch {
	case op == "reserve" && m.last == nil:
		r := fx.Reserve(authority.ObjectUserSpot, m.id, m.target(rt, rapid.Bool().Draw(rt, "onB")))
		m.res = &r
		return r.Res.Creating.OwnershipToken
	case op == "commit" && m.res != nil:
		ready := fx.MustCommit(*m.res, []byte("ready"))
		m.res = nil
		return ready.OwnershipToken
	case op == "abort" && m.res != nil:
		res, err := st.Abort(ctx, m.res.AbortRequest())
		if err != nil || res.Kind != authority.KindAborted {
			rt.Fatalf("abort: %+v %v", res, err)
		}
		m.res = nil
	case op == "put" && active:
		return m.cas(rt, authority.Put([]byte("put")))
	case op == "restore" && active:
		return m.cas(rt, authority.Restore(m.last.Owner(), []byte("restored")))
	case op == "rebind" && active:
		owner := m.last.Owner()
		m.leases[owner.OwnerID]++
		next := authority.OwnerToken{OwnerID: owner.OwnerID, LeaseGeneration: m.leases[owner.OwnerID]}
		fx.SetLive(Target(m.last.Allocation.Descriptor, NodeLifecycle, next), true)
		return m.cas(rt, authority.RebindOwnerLease(owner, next, []byte("rebound")))
	case op == "delete" && active:
		res, err := st.CompareExchangeAuthority(ctx, m.key, m.last.StoreVersion, authority.Delete())
		if err != nil || res.Kind != authority.KindDeleted {
			rt.Fatalf("delete: %+v %v", res, err)
		}
	case (op == "move" || op == "self" || op == "keep") && active:
		return m.aggregate(rt, op)
	}
	return 0
}

// target is OwnerA on NodeA or OwnerB on NodeB, at the owner's current lease.
func (m *tokenModel) target(rt *rapid.T, onB bool) authority.CreationTarget {
	node, owner := NodeA, OwnerA.OwnerID
	if onB {
		node, owner = NodeB, OwnerB.OwnerID
	}
	tg := Target(node, NodeLifecycle, authority.OwnerToken{OwnerID: owner, LeaseGeneration: m.leases[owner]})
	m.fx.SetLive(tg, true)
	return tg
}

func (m *tokenModel) cas(rt *rapid.T, mut authority.Mutation) int64 {
	res, err := m.fx.Store().CompareExchangeAuthority(m.fx.Ctx(), m.key, m.last.StoreVersion, mut)
	if err != nil || res.Kind != authority.KindStored {
		rt.Fatalf("compare-exchange %v: %+v %v", mut.Kind, res, err)
	}
	return res.Snapshot.OwnershipToken
}

// aggregate commits an aggregate with the row as a participant: moved to
// the other owner's node (move), a newOwner transition to its own owner
// (self), or kept where it is while a new row of the other owner moves in
// next to it (keep; an aggregate moves at least one row).
func (m *tokenModel) aggregate(rt *rapid.T, op string) int64 {
	m.moves++
	onB := m.last.OwnerID == OwnerB.OwnerID
	transition := authority.TransitionPreserve
	parts := []authority.AggregateParticipant{}
	move := op != "keep"
	switch op {
	case "move":
		onB = !onB
		transition = authority.TransitionNewOwner
	case "self":
		transition = authority.TransitionNewOwner
	default:
		id := fmt.Sprintf("%s-mover-%d", m.id, m.moves)
		mover := m.fx.Active(authority.ObjectUserSpot, id, m.target(rt, !onB))
		parts = append(parts, Participant(m.fx.Key(authority.ObjectUserSpot, id), mover.StoreVersion, authority.TransitionNewOwner, []byte("mover")))
	}
	parts = append(parts, Participant(m.key, m.last.StoreVersion, transition, []byte("aggregate")))
	req := AggregateRequest(m.id+"-agg", int64(m.moves), m.target(rt, onB), Capacity(authority.ObjectUserSpot, DefaultStableType), parts...)
	res, err := m.fx.Store().CommitAggregate(m.fx.Ctx(), m.fx.MustPrepare(req))
	if err != nil || res.Kind != authority.KindCommitted || len(res.OwnershipTokens) != 1 {
		rt.Fatalf("aggregate commit: %+v %v", res, err)
	}
	if tok, ok := res.OwnershipTokens[m.key]; ok != move {
		rt.Fatalf("aggregate commit (move %v) listed tokens %v", move, res.OwnershipTokens)
	} else if ok {
		return tok
	}
	return 0
}

// check reads the row after op and compares its token with the state
// before; granted is the token op's result carried (0: none).
func (m *tokenModel) check(rt *rapid.T, op string, granted int64) {
	read, err := m.fx.Store().ReadAuthority(m.fx.Ctx(), m.key)
	if err != nil {
		rt.Fatalf("read after %s: %v", op, err)
	}
	prev := m.last
	if read.Kind != authority.KindSnapshot {
		m.last = nil
		return
	}
	now := read.Snapshot
	tok := now.OwnershipToken
	if tok <= 0 || (granted != 0 && granted != tok) {
		rt.Fatalf("after %s: token %d, the result said %d", op, tok, granted)
	}
	switch {
	case prev == nil || prev.Owner() != now.Owner(): // a new owner or owner lease
		if tok <= m.max {
			rt.Fatalf("after %s: owner %v has token %d, not above the key's earlier %d", op, now.Owner(), tok, m.max)
		}
	case tok != prev.OwnershipToken:
		rt.Fatalf("after %s: owner %v unchanged but the token moved %d → %d", op, now.Owner(), prev.OwnershipToken, tok)
	}
	m.max = max(m.max, tok)
	m.last = now
}
