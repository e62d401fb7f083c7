package authority_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"sync"
	"testing"
	"time"

	authority "github.com/zlink-systems/authority"
)

func TestCapacityVectorCloneEqual(t *testing.T) {
	c := authority.CapacityVector{Actors: 1, Spots: 2, SpotType: spotType(3)}
	d := c.Clone()
	if !d.Equal(c) || !c.Equal(d) {
		t.Fatalf("clone %+v not equal to %+v", d, c)
	}
	d.SpotType.Count = 9
	if c.SpotType.Count != 3 {
		t.Error("Clone shares the Spot type")
	}
	if d.Equal(c) {
		t.Error("vectors with different Spot type counts are equal")
	}
	if plain := (authority.CapacityVector{Actors: 1}).Clone(); plain.SpotType != nil || plain.Actors != 1 {
		t.Errorf("Clone of a plain vector = %+v", plain)
	}
	base := authority.CapacityVector{Actors: 1, Spots: 2, SpotType: spotType(3)}
	for name, o := range map[string]authority.CapacityVector{
		"actors":        {Actors: 2, Spots: 2, SpotType: spotType(3)},
		"spots":         {Actors: 1, Spots: 3, SpotType: spotType(3)},
		"no spot type":  {Actors: 1, Spots: 2},
		"stable type":   {Actors: 1, Spots: 2, SpotType: &authority.SpotTypeCapacity{ObjectKind: authority.ObjectUserSpot, StableType: "x", Count: 3}},
		"spot kind":     {Actors: 1, Spots: 2, SpotType: &authority.SpotTypeCapacity{ObjectKind: authority.ObjectInstanceSpot, StableType: "chat", Count: 3}},
		"spot type cnt": {Actors: 1, Spots: 2, SpotType: spotType(4)},
	} {
		if base.Equal(o) || o.Equal(base) {
			t.Errorf("%s: %+v equals %+v", name, base, o)
		}
	}
	if !(authority.CapacityVector{}).Equal(authority.CapacityVector{}) {
		t.Error("zero vectors differ")
	}
}

func sampleSnapshot() *authority.Snapshot {
	return &authority.Snapshot{
		StoreVersion:             "7",
		Payload:                  []byte("payload"),
		ObjectGeneration:         2,
		AuthorityOwnerGeneration: 3,
		OwnerID:                  "owner-1",
		OwnerLeaseGeneration:     4,
		Allocation: authority.PlacementAllocation{
			State: authority.AllocationReserved, ObjectKind: authority.ObjectUserSpot, StableType: "chat",
			Descriptor: node, DescriptorLifecycleGeneration: 3,
			Capacity: authority.CapacityVector{Spots: 1, SpotType: spotType(1)},
		},
		PendingCreation: &authority.PendingCreation{
			ReservationID: "res", RequestContentReference: "ref", RequestSHA256: bytes.Repeat([]byte{1}, 32), RequestEncodedSize: 5,
		},
		StoreNow: validateNow,
	}
}

func TestSnapshotClone(t *testing.T) {
	var nilSnap *authority.Snapshot
	if nilSnap.Clone() != nil {
		t.Error("nil Clone is not nil")
	}
	s := sampleSnapshot()
	c := s.Clone()
	if c == s || !reflect.DeepEqual(c, s) { // DeepEqual follows pointers
		t.Fatalf("clone %+v differs from %+v", c, s)
	}
	c.Payload[0] = 'X'
	c.Allocation.Capacity.SpotType.Count = 9
	c.PendingCreation.RequestSHA256[0] = 9
	c.PendingCreation.ReservationID = "other"
	if s.Payload[0] != 'p' || s.Allocation.Capacity.SpotType.Count != 1 ||
		s.PendingCreation.RequestSHA256[0] != 1 || s.PendingCreation.ReservationID != "res" {
		t.Error("Snapshot.Clone shares state with the original")
	}
	s.PendingCreation = nil
	if c := s.Clone(); c.PendingCreation != nil {
		t.Error("Clone invented a pending creation")
	}
	if got := s.Owner(); got != (authority.OwnerToken{OwnerID: "owner-1", LeaseGeneration: 4}) {
		t.Errorf("Owner = %+v", got)
	}
}

func TestPlacementAllocationClone(t *testing.T) {
	a := sampleSnapshot().Allocation
	c := a.Clone()
	c.Capacity.SpotType.Count = 5
	if a.Capacity.SpotType.Count != 1 {
		t.Error("PlacementAllocation.Clone shares the capacity")
	}
}

func TestTerminalRecordClone(t *testing.T) {
	var nilRec *authority.TerminalRecord
	if nilRec.Clone() != nil {
		t.Error("nil Clone is not nil")
	}
	r := &authority.TerminalRecord{
		State: authority.TerminalCreated, Operation: validOperation(), ReservationID: "res",
		ObjectKind: authority.ObjectActor, TerminalEnvelope: []byte("env"), TerminalEnvelopeSHA256: []byte("sha"),
		ExpiresAt: validateNow.Add(time.Hour), StoreNow: validateNow,
	}
	c := r.Clone()
	if c == r || c.State != r.State || c.Operation != r.Operation || c.ReservationID != r.ReservationID ||
		c.ObjectKind != r.ObjectKind || !bytes.Equal(c.TerminalEnvelope, r.TerminalEnvelope) ||
		!bytes.Equal(c.TerminalEnvelopeSHA256, r.TerminalEnvelopeSHA256) || !c.ExpiresAt.Equal(r.ExpiresAt) || !c.StoreNow.Equal(r.StoreNow) {
		t.Fatalf("clone %+v differs from %+v", c, r)
	}
	c.TerminalEnvelope[0] = 'X'
	c.TerminalEnvelopeSHA256[0] = 'X'
	if r.TerminalEnvelope[0] != 'e' || r.TerminalEnvelopeSHA256[0] != 's' {
		t.Error("TerminalRecord.Clone shares bytes")
	}
}

func TestAggregateRequestCloneEqual(t *testing.T) {
	r := validAggregate()
	r.Capacity = authority.CapacityVector{Actors: 1, SpotType: spotType(1)}
	r.Participants[0].MembershipMutation = []byte("m")
	c := r.Clone()
	if !r.Equal(c) || !c.Equal(&r) {
		t.Fatal("clone not equal")
	}
	c.InventoryDigest[0] = 1
	c.Participants[0].AuthorityPayload[0] = 'X'
	c.Participants[0].MembershipMutation[0] = 'X'
	c.Capacity.SpotType.Count = 2
	c.Participants[1].AuthorityKey = "actor/z"
	if r.InventoryDigest[0] != 0 || r.Participants[0].AuthorityPayload[0] != 'a' ||
		r.Participants[0].MembershipMutation[0] != 'm' || r.Capacity.SpotType.Count != 1 || r.Participants[1].AuthorityKey != "actor/b" {
		t.Error("AggregatePrepareRequest.Clone shares state")
	}

	edits := map[string]func(*authority.AggregatePrepareRequest){
		"id":                func(q *authority.AggregatePrepareRequest) { q.AggregateID = "x" },
		"generation":        func(q *authority.AggregatePrepareRequest) { q.AggregateGeneration++ },
		"target owner":      func(q *authority.AggregatePrepareRequest) { q.TargetOwner.LeaseGeneration++ },
		"digest":            func(q *authority.AggregatePrepareRequest) { q.InventoryDigest[5] = 1 },
		"participant count": func(q *authority.AggregatePrepareRequest) { q.Participants = q.Participants[:1] },
		"descriptor":        func(q *authority.AggregatePrepareRequest) { q.TargetDescriptor.RID = "x" },
		"lifecycle":         func(q *authority.AggregatePrepareRequest) { q.TargetDescriptorLifecycleGeneration++ },
		"capacity":          func(q *authority.AggregatePrepareRequest) { q.Capacity.Actors++ },
		"participant key":   func(q *authority.AggregatePrepareRequest) { q.Participants[1].AuthorityKey = "actor/c" },
		"expected version":  func(q *authority.AggregatePrepareRequest) { q.Participants[0].ExpectedStoreVersion = "x" },
		"owner transition": func(q *authority.AggregatePrepareRequest) {
			q.Participants[0].OwnerTransition = authority.TransitionPreserve
		},
		"payload":            func(q *authority.AggregatePrepareRequest) { q.Participants[1].AuthorityPayload = []byte("z") },
		"membership":         func(q *authority.AggregatePrepareRequest) { q.Participants[1].MembershipMutation = []byte("z") },
		"membership removed": func(q *authority.AggregatePrepareRequest) { q.Participants[0].MembershipMutation = nil },
	}
	for name, edit := range edits {
		o := r.Clone()
		edit(o)
		if r.Equal(o) || o.Equal(&r) {
			t.Errorf("%s: changed request still Equal", name)
		}
	}
	// nil and empty byte slices are the same bytes.
	o := r.Clone()
	o.Participants[1].MembershipMutation = []byte{}
	if !r.Equal(o) {
		t.Error("nil and empty membership mutation differ")
	}
}

func TestAggregateRequestFenceAndTarget(t *testing.T) {
	r := validAggregate()
	if f := r.Fence(); f != (authority.Fence{AggregateID: "agg-1", AggregateGeneration: 1}) {
		t.Errorf("Fence = %+v", f)
	}
	a := r.TargetAllocation()
	if a.State != authority.AllocationActive || a.ObjectKind != authority.ObjectActor || a.StableType != "" ||
		a.Descriptor != r.TargetDescriptor || a.DescriptorLifecycleGeneration != 1 || !a.Capacity.Equal(r.Capacity) {
		t.Errorf("TargetAllocation = %+v", a)
	}
	r.Capacity = authority.CapacityVector{Spots: 2, SpotType: &authority.SpotTypeCapacity{ObjectKind: authority.ObjectInstanceSpot, StableType: "inst", Count: 2}}
	a = r.TargetAllocation()
	if a.ObjectKind != authority.ObjectInstanceSpot || a.StableType != "inst" || !a.Capacity.Equal(r.Capacity) {
		t.Errorf("TargetAllocation(spot type) = %+v", a)
	}
	a.Capacity.SpotType.Count = 7
	if r.Capacity.SpotType.Count != 2 {
		t.Error("TargetAllocation shares the request's capacity")
	}
}

func TestSmallHelpers(t *testing.T) {
	if d := target().Descriptor(); d != (authority.NodeDescriptor{MeshName: "mesh", RID: "node-1"}) {
		t.Errorf("CreationTarget.Descriptor = %+v", d)
	}
	if v := authority.StoreVersion("42"); v.String() != "42" {
		t.Errorf("StoreVersion.String = %q", v.String())
	}
	m := authority.Missing(validateNow)
	if m.Kind != authority.KindMissing || m.Snapshot != nil || !m.StoreNow.Equal(validateNow) {
		t.Errorf("Missing = %+v", m)
	}
	s := sampleSnapshot()
	f := authority.Found(s)
	if f.Kind != authority.KindSnapshot || f.Snapshot != s || !f.StoreNow.Equal(s.StoreNow) {
		t.Errorf("Found = %+v", f)
	}
	before := time.Now()
	now := authority.SystemClock{}.Now()
	if now.Before(before) || now.After(time.Now()) {
		t.Errorf("SystemClock.Now = %v, not between %v and now", now, before)
	}
}

func TestErrors(t *testing.T) {
	sentinels := []error{
		authority.ErrInvalidArgument, authority.ErrUnavailable, authority.ErrOutcomeUnknown, authority.ErrLimitExceeded,
		authority.ErrAccessDenied, authority.ErrUnsupportedServer, authority.ErrCorrupt, authority.ErrClosed,
	}
	for i, s := range sentinels {
		err := authority.Wrap(s, "it broke", nil)
		if err.Error() != "it broke" {
			t.Errorf("Wrap without cause: %q", err.Error())
		}
		withCause := authority.Wrap(s, "it broke", io.ErrUnexpectedEOF)
		if withCause.Error() != "it broke: unexpected EOF" {
			t.Errorf("Wrap with cause: %q", withCause.Error())
		}
		wrapped := fmt.Errorf("outer: %w", withCause)
		for j, other := range sentinels {
			for _, e := range []error{err, withCause, wrapped} {
				if got := errors.Is(e, other); got != (i == j) {
					t.Errorf("errors.Is(%v, %v) = %v", e, other, got)
				}
			}
		}
		if !errors.Is(withCause, io.ErrUnexpectedEOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			t.Error("cause not unwrapped correctly")
		}
		var ae *authority.Error
		if !errors.As(wrapped, &ae) || ae.Sentinel != s || ae.Message != "it broke" || ae.Cause != io.ErrUnexpectedEOF {
			t.Errorf("errors.As = %+v", ae)
		}
		if got := len(ae.Unwrap()); got != 2 {
			t.Errorf("Unwrap with cause has %d errors", got)
		}
		if got := err.(*authority.Error).Unwrap(); len(got) != 1 || got[0] != s {
			t.Errorf("Unwrap without cause = %v", got)
		}
	}
	inv := authority.Invalid("bad")
	if !errors.Is(inv, authority.ErrInvalidArgument) || inv.Error() != "bad" {
		t.Errorf("Invalid = %v", inv)
	}
	seen := map[string]bool{}
	for _, s := range sentinels {
		if seen[s.Error()] {
			t.Errorf("duplicate sentinel text %q", s.Error())
		}
		seen[s.Error()] = true
	}
}

func TestManualClock(t *testing.T) {
	c := authority.NewManualClock(validateNow)
	var _ authority.Clock = c
	if !c.Now().Equal(validateNow) || !c.Now().Equal(c.Now()) {
		t.Fatalf("Now = %v, want %v", c.Now(), validateNow)
	}
	c.Advance(time.Second)
	c.Advance(0)
	if want := validateNow.Add(time.Second); !c.Now().Equal(want) {
		t.Errorf("after Advance: %v, want %v", c.Now(), want)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				c.Advance(time.Millisecond)
				_ = c.Now()
			}
		}()
	}
	wg.Wait()
	if want := validateNow.Add(time.Second + 800*time.Millisecond); !c.Now().Equal(want) {
		t.Errorf("after concurrent Advance: %v, want %v", c.Now(), want)
	}
}

func TestCreationOperationKey(t *testing.T) {
	op := validOperation()
	if got, want := op.Key(), "node-1/1/00000000000000000000000000000001"; got != want {
		t.Errorf("Key = %q, want %q", got, want)
	}
	rids := []string{"a", "a/1", "a%2F1", "a%", "%", "/", "a/1/0", "é", "\xff", "a b", "1"}
	gens := []int64{1, 2, 10, 11, 101, authority.MaxGeneration}
	ids := []authority.CreationOperationID{{Low: 1}, {High: 1}, {High: 1, Low: 1}, {Low: 0x10}, {High: ^uint64(0), Low: ^uint64(0)}, {Low: 0x100000000}}
	seen := map[string]authority.CreationOperation{}
	for _, rid := range rids {
		for _, g := range gens {
			for _, id := range ids {
				o := authority.CreationOperation{SourceNodeRID: rid, SourceNodeGeneration: g, OperationID: id}
				k := o.Key()
				if prev, dup := seen[k]; dup {
					t.Fatalf("%+v and %+v share key %q", prev, o, k)
				}
				seen[k] = o
				if o.Key() != k {
					t.Fatalf("Key not deterministic for %+v", o)
				}
			}
		}
	}
}
