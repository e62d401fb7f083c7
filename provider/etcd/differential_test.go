package etcd_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/conformance"
	etcdstore "github.com/zlink-systems/authority/provider/etcd"
	"github.com/zlink-systems/authority/provider/memory"
)

// side is one provider under the differential test with what the driver
// learned from its own results (versions and reservation IDs differ between
// providers; the driver makes the same choice on both).
type side struct {
	name    string
	store   authority.Store
	setLive func(node authority.NodeDescriptor, lc int64, owner authority.OwnerToken, live bool)
	// per key: versions seen, newest last; the last reservation
	versions map[authority.Key][]authority.StoreVersion
	res      map[authority.Key]authority.ReserveResult
}

func (s *side) saw(key authority.Key, snap *authority.Snapshot) {
	if snap != nil {
		s.versions[key] = append(s.versions[key], snap.StoreVersion)
	}
}

// version picks the newest version seen (pick 0), an older one (pick > 0),
// or the zero version when there is none.
func (s *side) version(key authority.Key, pick int) authority.StoreVersion {
	v := s.versions[key]
	if len(v) == 0 {
		return ""
	}
	return v[max(0, len(v)-1-pick)]
}

// renaming is a bijection between the two providers' names for the same
// thing (versions, generations).
type renaming struct{ ab, ba map[string]string }

func newRenaming() *renaming { return &renaming{map[string]string{}, map[string]string{}} }

func (r *renaming) same(t *testing.T, what, a, b string) {
	t.Helper()
	if x, ok := r.ab[a]; ok {
		require.Equal(t, x, b, "%s %q of memory is %q of etcd, seen before as %q", what, a, b, x)
	}
	if x, ok := r.ba[b]; ok {
		require.Equal(t, x, a, "%s %q of etcd is %q of memory, seen before as %q", what, b, a, x)
	}
	r.ab[a], r.ba[b] = b, a
}

type differential struct {
	t         *testing.T
	rng       *rand.Rand
	aux       *rand.Rand // the choices added later (terminal reads, clock steps back), so rng's sequence stays
	sides     [2]*side
	clock     [2]*authority.ManualClock
	vers      *renaming
	objGen    *renaming
	ownGen    *renaming
	ctx       context.Context
	keys      []authority.ObjectKey
	targets   []authority.CreationTarget
	ops       []authority.CreationOperation
	step      int
	lastFence authority.Fence
	// outcomes counts the outcome kinds seen, per operation
	outcomes map[string]int
}

// sameSnapshot compares two snapshots of one row up to renaming.
func (d *differential) sameSnapshot(a, b *authority.Snapshot) {
	t := d.t
	t.Helper()
	if a == nil || b == nil {
		require.Equal(t, a == nil, b == nil, "step %d: snapshot presence", d.step)
		return
	}
	d.vers.same(t, "version", string(a.StoreVersion), string(b.StoreVersion))
	d.objGen.same(t, "object generation", fmt.Sprint(a.ObjectGeneration), fmt.Sprint(b.ObjectGeneration))
	d.ownGen.same(t, "owner generation", fmt.Sprint(a.AuthorityOwnerGeneration), fmt.Sprint(b.AuthorityOwnerGeneration))
	require.Equal(t, string(a.Payload), string(b.Payload), "step %d: payload", d.step)
	require.Equal(t, a.Owner(), b.Owner(), "step %d: owner", d.step)
	require.Equal(t, a.Allocation, b.Allocation, "step %d: allocation", d.step)
	require.Equal(t, a.PendingCreation == nil, b.PendingCreation == nil, "step %d: pending creation", d.step)
}

func (d *differential) sameRead(a, b authority.ReadResult) {
	d.t.Helper()
	require.Equal(d.t, a.Kind, b.Kind, "step %d: read kind", d.step)
	d.sameSnapshot(a.Snapshot, b.Snapshot)
}

// both runs op on each side and requires the same outcome kind.
func both[R any](d *differential, what string, op func(s *side) (R, error), kind func(R) authority.ResultKind) [2]R {
	d.t.Helper()
	var out [2]R
	var errs [2]error
	for i, s := range d.sides {
		out[i], errs[i] = op(s)
	}
	require.Equal(d.t, errs[0] == nil, errs[1] == nil, "step %d %s: errors memory=%v etcd=%v", d.step, what, errs[0], errs[1])
	if errors.Is(errs[0], authority.ErrInvalidArgument) && errors.Is(errs[1], authority.ErrInvalidArgument) {
		// a publication made on the clock after it stepped back, which both
		// stores refuse alike: their clocks never read earlier
		d.outcomes[what+"=invalid"]++
		return [2]R{}
	}
	require.NoError(d.t, errs[0], "step %d %s", d.step, what)
	require.Equal(d.t, kind(out[0]), kind(out[1]), "step %d %s: outcome", d.step, what)
	d.outcomes[what+"="+string(kind(out[0]))]++
	return out
}

func (d *differential) payload() []byte { return []byte(fmt.Sprintf("payload-%d", d.step)) }

func (d *differential) reserve() {
	k := d.keys[d.rng.IntN(len(d.keys))]
	tg := d.targets[d.rng.IntN(len(d.targets))]
	ref := fmt.Sprintf("ref-%d", d.step)
	sum := sha256.Sum256([]byte(ref))
	req := authority.ReserveRequest{
		Key:             k,
		Intent:          authority.CreationIntent{StableType: conformance.DefaultStableType, RequestContentReference: ref, RequestSHA256: sum[:], RequestEncodedSize: int64(len(ref))},
		Target:          tg,
		CreatingPayload: d.payload(),
		Capacity:        conformance.Capacity(k.Kind, conformance.DefaultStableType),
	}
	if d.rng.IntN(10) == 0 { // the wrong stable type: typeMismatch on an existing row
		req.Intent.StableType = "other-type"
		if k.Kind.IsSpot() {
			req.Capacity = conformance.Capacity(k.Kind, "other-type")
		}
	}
	key, _ := k.Encode()
	out := both(d, "reserve", func(s *side) (authority.ReserveResult, error) { return s.store.Reserve(d.ctx, req) },
		func(r authority.ReserveResult) authority.ResultKind { return r.Kind })
	d.sameRead(out[0].Current, out[1].Current)
	d.sameSnapshot(out[0].Creating, out[1].Creating)
	for i, s := range d.sides {
		if out[i].Kind == authority.KindReserved {
			s.res[key] = out[i]
			s.saw(key, out[i].Creating)
		}
	}
}

// finish commits, completes or aborts the last reservation of a key.
func (d *differential) finish() {
	k := d.keys[d.rng.IntN(len(d.keys))]
	key, _ := k.Encode()
	pick := d.rng.IntN(3) / 2 // mostly the newest version
	action := d.rng.IntN(3)
	if d.sides[0].res[key].Kind == "" || d.sides[1].res[key].Kind == "" {
		return
	}
	target := func(s *side) authority.CreationTarget {
		tg := d.targets[0]
		if c := s.res[key].Creating; c != nil {
			tg = conformance.Target(c.Allocation.Descriptor, c.Allocation.DescriptorLifecycleGeneration, c.Owner())
		}
		return tg
	}
	switch {
	case action == 0:
		out := both(d, "abort", func(s *side) (authority.AbortResult, error) {
			return s.store.Abort(d.ctx, authority.AbortRequest{Key: k, ReservationID: s.res[key].ReservationID, ExpectedStoreVersion: s.version(key, pick), Target: target(s)})
		}, func(r authority.AbortResult) authority.ResultKind { return r.Kind })
		_ = out
	case k.Kind == authority.ObjectActor:
		kinds := []authority.CompletionKind{authority.TerminalCreated, authority.TerminalCreated, authority.TerminalRejected, authority.TerminalFailed}
		kind := kinds[d.rng.IntN(len(kinds))]
		op := d.ops[d.rng.IntN(len(d.ops))]
		env := []byte(fmt.Sprintf("env-%d", d.step))
		sum := sha256.Sum256(env)
		ready := d.payload()
		out := both(d, "completeCreation", func(s *side) (authority.CompleteCreationResult, error) {
			i := 0
			if s == d.sides[1] {
				i = 1
			}
			pub := &authority.TerminalPublication{Operation: op, TerminalEnvelope: env, TerminalEnvelopeSHA256: sum[:], OperationDeadline: d.clock[i].Now().Add(time.Minute)}
			c := authority.Completion{Kind: kind, Terminal: pub}
			if kind == authority.TerminalCreated {
				c.ReadyPayload = ready
			}
			return s.store.CompleteCreation(d.ctx, authority.CompleteCreationRequest{Key: k, ReservationID: s.res[key].ReservationID, ExpectedStoreVersion: s.version(key, pick), Target: target(s), Completion: c})
		}, func(r authority.CompleteCreationResult) authority.ResultKind { return r.Kind })
		d.sameSnapshot(out[0].Ready, out[1].Ready)
		require.Equal(d.t, out[0].Terminal == nil, out[1].Terminal == nil)
		if out[0].Terminal != nil {
			require.Equal(d.t, out[0].Terminal.State, out[1].Terminal.State, "step %d: terminal state", d.step)
			require.Equal(d.t, out[0].Terminal.TerminalEnvelope, out[1].Terminal.TerminalEnvelope, "step %d: terminal envelope", d.step)
		}
		for i, s := range d.sides {
			s.saw(key, out[i].Ready)
		}
	default:
		ready := d.payload()
		out := both(d, "commit", func(s *side) (authority.CommitResult, error) {
			return s.store.Commit(d.ctx, authority.CommitRequest{Key: k, ReservationID: s.res[key].ReservationID, ExpectedStoreVersion: s.version(key, pick), Target: target(s), ReadyPayload: ready})
		}, func(r authority.CommitResult) authority.ResultKind { return r.Kind })
		d.sameSnapshot(out[0].Ready, out[1].Ready)
		for i, s := range d.sides {
			s.saw(key, out[i].Ready)
		}
	}
}

func (d *differential) compareExchange() {
	k := d.keys[d.rng.IntN(len(d.keys))]
	key, _ := k.Encode()
	pick := d.rng.IntN(4) / 3
	owners := []authority.OwnerToken{d.targets[0].Owner, d.targets[1].Owner, d.targets[2].Owner}
	var m authority.Mutation
	switch d.rng.IntN(5) {
	case 0:
		m = authority.Delete()
	case 1:
		m = authority.Restore(owners[d.rng.IntN(len(owners))], d.payload())
	case 2:
		from := owners[d.rng.IntN(2)]
		to := from
		to.LeaseGeneration = 3 - from.LeaseGeneration // owner-1 generations 1 <-> 2
		m = authority.RebindOwnerLease(from, to, d.payload())
	default:
		m = authority.Put(d.payload())
	}
	out := both(d, "compareExchange "+string(m.Kind), func(s *side) (authority.CompareExchangeResult, error) {
		return s.store.CompareExchangeAuthority(d.ctx, key, s.version(key, pick), m)
	}, func(r authority.CompareExchangeResult) authority.ResultKind { return r.Kind })
	d.sameSnapshot(out[0].Snapshot, out[1].Snapshot)
	d.sameRead(out[0].Current, out[1].Current)
	for i, s := range d.sides {
		s.saw(key, out[i].Snapshot)
		s.saw(key, out[i].Current.Snapshot)
	}
}

func (d *differential) read() {
	k := d.keys[d.rng.IntN(len(d.keys))]
	key, _ := k.Encode()
	out := both(d, "read", func(s *side) (authority.ReadResult, error) { return s.store.ReadAuthority(d.ctx, key) },
		func(r authority.ReadResult) authority.ResultKind { return r.Kind })
	d.sameRead(out[0], out[1])
	for i, s := range d.sides {
		s.saw(key, out[i].Snapshot)
	}
}

// readTerminal reads the creation terminal of an operation on both sides.
func (d *differential) readTerminal() {
	op := d.ops[d.rng.IntN(len(d.ops))]
	out := both(d, "readCreationTerminal", func(s *side) (authority.TerminalReadResult, error) { return s.store.ReadCreationTerminal(d.ctx, op) },
		func(r authority.TerminalReadResult) authority.ResultKind { return r.Kind })
	if out[0].Kind == authority.KindFound {
		require.Equal(d.t, out[0].Record.State, out[1].Record.State, "step %d: terminal state", d.step)
		require.Equal(d.t, out[0].Record.TerminalEnvelope, out[1].Record.TerminalEnvelope, "step %d: terminal envelope", d.step)
	}
}

// moveClock moves both clocks on by a minute, or (one time in four) steps
// them back by up to three minutes, as an NTP step does: back before the
// expiry of terminals that operations already saw expired (a terminal
// lives six minutes).
func (d *differential) moveClock() {
	by := time.Minute
	if d.aux.IntN(4) == 0 {
		by = -time.Duration(1+d.aux.IntN(3)) * time.Minute
		d.outcomes["clock=steppedBack"]++
	}
	for _, c := range d.clock {
		c.Advance(by)
	}
}

func (d *differential) aggregate() {
	id := fmt.Sprintf("agg-%d", d.rng.IntN(3))
	gen := int64(1 + d.rng.IntN(4))
	fence := authority.Fence{AggregateID: id, AggregateGeneration: gen}
	if d.lastFence.AggregateID != "" && d.rng.IntN(4) != 0 {
		fence = d.lastFence
	}
	switch d.rng.IntN(3) {
	case 0:
		both(d, "commitAggregate", func(s *side) (authority.CommitAggregateResult, error) { return s.store.CommitAggregate(d.ctx, fence) },
			func(r authority.CommitAggregateResult) authority.ResultKind { return r.Kind })
		return
	case 1:
		both(d, "abortAggregate", func(s *side) (authority.AbortAggregateResult, error) { return s.store.AbortAggregate(d.ctx, fence) },
			func(r authority.AbortAggregateResult) authority.ResultKind { return r.Kind })
		return
	}
	tg := d.targets[d.rng.IntN(len(d.targets))]
	// mostly rows memory sees active, sometimes any row
	var chosen []authority.ObjectKey
	for _, k := range d.keys {
		key, _ := k.Encode()
		r, err := d.sides[0].store.ReadAuthority(d.ctx, key)
		require.NoError(d.t, err)
		active := r.Kind == authority.KindSnapshot && r.Snapshot.Allocation.State == authority.AllocationActive
		if active && d.rng.IntN(2) == 0 || d.rng.IntN(12) == 0 {
			chosen = append(chosen, k)
		}
	}
	if len(chosen) == 0 {
		return
	}
	transitions := make([]authority.GenerationTransition, len(chosen))
	for i := range chosen {
		transitions[i] = authority.TransitionNewOwner
		if d.rng.IntN(3) == 0 {
			transitions[i] = authority.TransitionPreserve
		}
	}
	// the capacity of the newOwner rows as memory sees them (sometimes wrong)
	capacity := authority.CapacityVector{}
	for i, k := range chosen {
		key, _ := k.Encode()
		r, err := d.sides[0].store.ReadAuthority(d.ctx, key)
		require.NoError(d.t, err)
		if r.Kind == authority.KindSnapshot && transitions[i] == authority.TransitionNewOwner {
			if c, err := authority.AddCapacity(capacity, r.Snapshot.Allocation.Capacity); err == nil {
				capacity = c
			}
		}
	}
	if capacity.Actors == 0 && capacity.Spots == 0 || d.rng.IntN(16) == 0 {
		capacity.Actors++
	}
	pick := d.rng.IntN(6) / 5
	d.lastFence = authority.Fence{AggregateID: id, AggregateGeneration: gen}
	both(d, "prepareAggregate", func(s *side) (authority.PrepareAggregateResult, error) {
		parts := make([]authority.AggregateParticipant, len(chosen))
		for i, k := range chosen {
			key, _ := k.Encode()
			parts[i] = conformance.Participant(key, s.version(key, pick), transitions[i], []byte(fmt.Sprintf("agg-%d-%d", d.step, i)))
		}
		return s.store.PrepareAggregate(d.ctx, conformance.AggregateRequest(id, gen, tg, capacity, parts...))
	}, func(r authority.PrepareAggregateResult) authority.ResultKind { return r.Kind })
}

func (d *differential) removeAll() {
	owner := d.targets[d.rng.IntN(len(d.targets))].Owner
	out := both(d, "removeAllByOwner", func(s *side) (int64, error) { return s.store.RemoveAllByOwner(d.ctx, owner) },
		func(n int64) authority.ResultKind { return authority.ResultKind(fmt.Sprint(n)) })
	_ = out
}

func (d *differential) toggleLive() {
	tg := d.targets[d.rng.IntN(len(d.targets))]
	live := d.rng.IntN(3) != 0
	for _, s := range d.sides {
		s.setLive(tg.Descriptor(), tg.NodeLifecycleGeneration, tg.Owner, live)
	}
}

// compareAll compares every row and capacity counter.
func (d *differential) compareAll() {
	for _, k := range d.keys {
		d.read()
		key, _ := k.Encode()
		out := both(d, "read", func(s *side) (authority.ReadResult, error) { return s.store.ReadAuthority(d.ctx, key) },
			func(r authority.ReadResult) authority.ResultKind { return r.Kind })
		d.sameRead(out[0], out[1])
	}
	for _, tg := range d.targets[:2] {
		for _, kind := range []authority.ObjectKind{authority.ObjectActor, authority.CounterSpots, authority.ObjectUserSpot} {
			out := both(d, "capacityUsage", func(s *side) (authority.CapacityUsage, error) {
				return s.store.CapacityUsage(d.ctx, tg.Descriptor(), tg.NodeLifecycleGeneration, kind, conformance.DefaultStableType)
			}, func(authority.CapacityUsage) authority.ResultKind { return "" })
			require.Equal(d.t, out[0], out[1], "step %d: capacity of %v %s", d.step, tg.Descriptor(), kind)
		}
	}
}

func TestDifferentialMemoryVsEtcd(t *testing.T) {
	const steps = 2000
	memClock, etcdClock := authority.NewManualClock(testEpoch), authority.NewManualClock(testEpoch)
	live := memory.NewLiveSet()
	policy := conformance.ActorLimit(3)
	mem := memory.New(memory.Config{Liveness: live, Clock: memClock, CapacityPolicy: policy, ReservationRetention: etcdstore.DefaultReservationRetention})
	es := newStore(t, nil, etcdstore.Config{Clock: etcdClock, CapacityPolicy: policy})
	ctx := context.Background()
	d := &differential{
		t: t, rng: rand.New(rand.NewPCG(20300102, 7)), aux: rand.New(rand.NewPCG(20300102, 8)), ctx: ctx,
		clock: [2]*authority.ManualClock{memClock, etcdClock},
		vers:  newRenaming(), objGen: newRenaming(), ownGen: newRenaming(),
		outcomes: map[string]int{},
	}
	d.sides[0] = &side{name: "memory", store: mem, setLive: live.Set,
		versions: map[authority.Key][]authority.StoreVersion{}, res: map[authority.Key]authority.ReserveResult{}}
	d.sides[1] = &side{name: "etcd", store: es, setLive: func(node authority.NodeDescriptor, lc int64, owner authority.OwnerToken, on bool) {
		var err error
		if on {
			err = es.MarkLive(ctx, node, lc, owner, liveTTL)
		} else {
			err = es.MarkDead(ctx, node, lc, owner)
		}
		require.NoError(t, err)
	}, versions: map[authority.Key][]authority.StoreVersion{}, res: map[authority.Key]authority.ReserveResult{}}
	for _, id := range []string{"a0", "a1", "a2", "a3"} {
		d.keys = append(d.keys, authority.ObjectKey{Kind: authority.ObjectActor, GlobalID: id})
	}
	for _, id := range []string{"s0", "s1", "s2"} {
		d.keys = append(d.keys, authority.ObjectKey{Kind: authority.ObjectUserSpot, GlobalID: id})
	}
	o1 := authority.OwnerToken{OwnerID: "owner-1", LeaseGeneration: 1}
	o1b := authority.OwnerToken{OwnerID: "owner-1", LeaseGeneration: 2}
	o2 := authority.OwnerToken{OwnerID: "owner-2", LeaseGeneration: 1}
	d.targets = []authority.CreationTarget{
		conformance.Target(conformance.NodeA, 1, o1), conformance.Target(conformance.NodeB, 1, o2),
		conformance.Target(conformance.NodeA, 1, o1b), conformance.Target(conformance.NodeB, 1, o1),
	}
	for i := 0; i < 3; i++ {
		d.ops = append(d.ops, authority.CreationOperation{SourceNodeRID: "src", SourceNodeGeneration: 1, OperationID: authority.CreationOperationID{High: 1, Low: uint64(i + 1)}})
	}
	for _, tg := range d.targets {
		for _, s := range d.sides {
			s.setLive(tg.Descriptor(), tg.NodeLifecycleGeneration, tg.Owner, true)
		}
	}
	counts := map[string]int{}
	for d.step = 0; d.step < steps; d.step++ {
		switch n := d.rng.IntN(100); {
		case n < 25:
			counts["reserve"]++
			d.reserve()
		case n < 50:
			counts["finish"]++
			d.finish()
		case n < 68:
			counts["compareExchange"]++
			d.compareExchange()
		case n < 78:
			counts["aggregate"]++
			d.aggregate()
		case n < 84:
			counts["read"]++
			d.read()
			if d.aux.IntN(2) == 0 {
				counts["readTerminal"]++
				d.readTerminal()
			}
		case n < 88:
			counts["removeAll"]++
			d.removeAll()
		case n < 95:
			counts["live"]++
			d.toggleLive()
		default:
			counts["clock"]++
			d.moveClock()
		}
		if d.step%100 == 99 {
			d.compareAll()
		}
	}
	d.compareAll()
	t.Logf("operations: %v; versions renamed: %d", counts, len(d.vers.ab))
	t.Logf("outcomes: %v", d.outcomes)
	// the sequence must exercise the interesting outcomes, not only refusals
	for _, want := range []string{
		"reserve=reserved", "reserve=alreadyExists", "reserve=placementCapacityExhausted", "reserve=typeMismatch",
		"commit=committed", "commit=alreadyCommitted", "commit=stale", "abort=aborted", "abort=alreadyAborted",
		"completeCreation=created", "completeCreation=rejected", "completeCreation=alreadyCompleted",
		"compareExchange put=stored", "compareExchange delete=deleted", "compareExchange rebindOwnerLease=stored",
		"compareExchange restore=stored", "prepareAggregate=prepared", "commitAggregate=committed", "abortAggregate=aborted",
		"readCreationTerminal=found", "readCreationTerminal=missing", "clock=steppedBack",
	} {
		require.NotZero(t, d.outcomes[want], "the sequence never produced %s", want)
	}
}
