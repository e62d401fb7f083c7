package conformance

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	authority "github.com/zlink-systems/authority"
)

// feedWorkload runs random operations on a few keys of two kinds and
// records, after every operation, the state of every key read back with
// ReadAuthority: the sequence of states each key went through, which a
// feed must deliver exactly once and in order (every operation changes a
// row at most once).
type feedWorkload struct {
	t      *testing.T
	fx     *Fixture
	rnd    *rand.Rand
	ids    []authority.ObjectKey
	keys   []authority.Key
	leases map[string]int64
	res    map[authority.Key]*Reservation
	last   map[authority.Key]*authority.Snapshot
	// seen is each key's sequence of states ("" absent), seenRows the
	// snapshot read at each (key, version).
	seen     map[authority.Key][]authority.StoreVersion
	seenRows map[string]*authority.Snapshot
	ops      map[string]int
}

func newFeedWorkload(t *testing.T, fx *Fixture, seed uint64) *feedWorkload {
	w := &feedWorkload{
		t: t, fx: fx, rnd: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		leases: map[string]int64{OwnerA.OwnerID: OwnerA.LeaseGeneration, OwnerB.OwnerID: OwnerB.LeaseGeneration},
		res:    map[authority.Key]*Reservation{}, last: map[authority.Key]*authority.Snapshot{},
		seen: map[authority.Key][]authority.StoreVersion{}, seenRows: map[string]*authority.Snapshot{},
		ops: map[string]int{},
	}
	for i := range 6 {
		for _, kind := range []authority.ObjectKind{authority.ObjectUserSpot, authority.ObjectActor} {
			id := authority.ObjectKey{Kind: kind, GlobalID: fmt.Sprintf("feed-%d", i)}
			w.ids = append(w.ids, id)
			w.keys = append(w.keys, fx.Key(kind, id.GlobalID))
		}
	}
	return w
}

// target is the owner on node A or B at its current lease, marked live.
func (w *feedWorkload) target(onB bool) authority.CreationTarget {
	node, owner := NodeA, OwnerA.OwnerID
	if onB {
		node, owner = NodeB, OwnerB.OwnerID
	}
	tg := Target(node, NodeLifecycle, authority.OwnerToken{OwnerID: owner, LeaseGeneration: w.leases[owner]})
	w.fx.SetLive(tg, true)
	return tg
}

// step runs one random operation, then reads every key back.
func (w *feedWorkload) step() {
	t, fx := w.t, w.fx
	t.Helper()
	if w.rnd.IntN(20) == 0 {
		w.global()
	} else {
		i := w.rnd.IntN(len(w.keys))
		w.keyed(w.ids[i], w.keys[i])
	}
	for _, k := range w.keys {
		read := fx.Read(k)
		var v authority.StoreVersion
		if read.Kind == authority.KindSnapshot {
			v = read.Snapshot.StoreVersion
			w.seenRows[string(k)+"@"+string(v)] = read.Snapshot
			w.last[k] = read.Snapshot
		} else {
			delete(w.last, k)
			delete(w.res, k)
		}
		if s := w.seen[k]; (len(s) == 0 && v != "") || (len(s) > 0 && s[len(s)-1] != v) {
			w.seen[k] = append(s, v)
		}
	}
}

// global removes every row of one owner's lease, or lets time pass (creation
// terminals expire; no row changes).
func (w *feedWorkload) global() {
	if w.rnd.IntN(2) == 0 && w.fx.H.AdvanceClock != nil {
		w.ops["expiry"]++
		w.fx.H.AdvanceClock(w.t, 6*time.Minute)
		return
	}
	w.ops["removeAllByOwner"]++
	owner := w.target(w.rnd.IntN(2) == 0).Owner
	_, err := w.fx.Store().RemoveAllByOwner(w.fx.Ctx(), owner)
	require.NoError(w.t, err)
}

// keyed runs an operation the row at key allows.
func (w *feedWorkload) keyed(id authority.ObjectKey, key authority.Key) {
	t, fx, st, ctx := w.t, w.fx, w.fx.Store(), w.fx.Ctx()
	t.Helper()
	r, snap := w.res[key], w.last[key]
	pick := func(ops ...string) string { op := ops[w.rnd.IntN(len(ops))]; w.ops[op]++; return op }
	switch {
	case snap == nil:
		pick("reserve")
		res := fx.MustReserve(fx.ReserveRequest(id.Kind, id.GlobalID, w.target(w.rnd.IntN(2) == 0)))
		w.res[key] = &res
	case r != nil && id.Kind == authority.ObjectActor:
		switch op := pick("completeCreated", "completeRejected", "completeFailed", "abort"); op {
		case "abort":
			res, err := st.Abort(ctx, r.AbortRequest())
			require.NoError(t, err)
			require.Equal(t, authority.KindAborted, res.Kind)
		default:
			kind := authority.CompletionKind(strings.ToLower(strings.TrimPrefix(op, "complete")))
			fx.MustComplete(*r, kind, []byte("ready"), fx.Publication())
		}
		delete(w.res, key)
	case r != nil:
		if pick("commit", "abort") == "commit" {
			fx.MustCommit(*r, []byte("ready"))
		} else {
			res, err := st.Abort(ctx, r.AbortRequest())
			require.NoError(t, err)
			require.Equal(t, authority.KindAborted, res.Kind)
		}
		delete(w.res, key)
	default:
		w.active(id, key, snap, pick("put", "rebind", "delete", "move"))
	}
}

// active runs op on the active row at key.
func (w *feedWorkload) active(id authority.ObjectKey, key authority.Key, snap *authority.Snapshot, op string) {
	t, fx := w.t, w.fx
	t.Helper()
	switch op {
	case "put":
		fx.Put(key, snap.StoreVersion, []byte(fmt.Sprintf("put-%d", fx.Next())))
	case "delete":
		fx.Delete(key, snap.StoreVersion)
	case "rebind":
		owner := snap.Owner()
		w.leases[owner.OwnerID]++
		next := authority.OwnerToken{OwnerID: owner.OwnerID, LeaseGeneration: w.leases[owner.OwnerID]}
		fx.SetLive(Target(snap.Allocation.Descriptor, NodeLifecycle, next), true)
		res, err := fx.Store().CompareExchangeAuthority(fx.Ctx(), key, snap.StoreVersion, authority.RebindOwnerLease(owner, next, []byte("rebound")))
		require.NoError(t, err)
		require.Equal(t, authority.KindStored, res.Kind)
	case "move":
		onB := snap.OwnerID != OwnerB.OwnerID
		req := AggregateRequest(fmt.Sprintf("feed-move-%d", fx.Next()), 1, w.target(onB), Capacity(id.Kind, DefaultStableType),
			Participant(key, snap.StoreVersion, authority.TransitionNewOwner, []byte("moved")))
		res, err := fx.Store().CommitAggregate(fx.Ctx(), fx.MustPrepare(req))
		require.NoError(t, err)
		require.Equal(t, authority.KindCommitted, res.Kind)
	}
}

// requireDelivered requires log's events, per key, to be exactly the
// states the workload read (for the keys under prefix), each with the
// snapshot read at that version.
func (w *feedWorkload) requireDelivered(l *feedLog, prefix string) {
	t := w.t
	t.Helper()
	want := map[authority.Key][]authority.StoreVersion{}
	for k, s := range w.seen {
		if strings.HasPrefix(string(k), prefix) && len(s) > 0 {
			want[k] = s
		}
	}
	require.Equal(t, want, l.perKey(), "per-key states: read back vs delivered")
	for _, ev := range l.events {
		if ev.Snapshot != nil {
			RequireSameRow(t, w.seenRows[string(ev.Key)+"@"+string(ev.Snapshot.StoreVersion)], ev.Snapshot)
		}
	}
}
