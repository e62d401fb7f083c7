package schema

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	authority "github.com/zlink-systems/authority"
	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/zlink-systems/authority/provider/etcd/storeversion"
)

// The fuzz targets of the decoders of bytes the provider reads back from
// etcd (anyone with write access to the namespace can put anything there):
// decoding never panics, refuses with ErrCorrupt, and what it accepts
// re-encodes to a fixed point. The seed corpus is under testdata/fuzz:
// encodings made by the codec plus edge cases.

const fuzzRowKey = "/ns/rows/actor/a1"

func requireCorrupt(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, authority.ErrCorrupt) {
		t.Fatalf("%s: error %v is not ErrCorrupt", what, err)
	}
	if !strings.Contains(err.Error(), "etcd key") {
		t.Fatalf("%s: error %q does not name the key", what, err)
	}
}

// seedRow is a row with every field set.
func seedRow() *Row {
	return &Row{
		Key: "actor/a1", ModRev: 7, CreateRev: 5, OwnerGen: 6, Token: 7,
		Owner: authority.OwnerToken{OwnerID: "owner-a", LeaseGeneration: 2},
		Alloc: authority.PlacementAllocation{
			State: authority.AllocationReserved, ObjectKind: authority.ObjectUserSpot, StableType: "type-a",
			Descriptor:                    authority.NodeDescriptor{MeshName: "mesh-1", RID: "node-a"},
			DescriptorLifecycleGeneration: 1,
			Capacity: authority.CapacityVector{Spots: 1, SpotType: &authority.SpotTypeCapacity{
				ObjectKind: authority.ObjectUserSpot, StableType: "type-a", Count: 1}},
		},
		Pending: &authority.PendingCreation{ReservationID: "r-1", RequestContentReference: "ref", RequestSHA256: []byte{1, 2, 3}, RequestEncodedSize: 3},
		Payload: []byte("payload"),
	}
}

// FuzzDecodeRow decodes arbitrary row values: no panic, ErrCorrupt when
// refused, and an accepted row re-encodes to a value that decodes to the
// same row and re-encodes identically.
func FuzzDecodeRow(f *testing.F) {
	r := seedRow()
	f.Add([]byte(r.Encode()), int64(7), int64(5))
	moved := *r
	moved.OwnerGen, moved.Token = 0, 0
	f.Add([]byte(moved.Encode()), int64(9), int64(5))
	active := *r
	active.Alloc.State, active.Pending, active.Payload, active.OwnerGen = authority.AllocationActive, nil, nil, 0
	f.Add([]byte(active.Encode()), int64(1), int64(1))
	f.Add([]byte{}, int64(0), int64(0))
	f.Add([]byte{rowFormat}, int64(1), int64(1))
	f.Add([]byte{rowFormat, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, int64(1), int64(1))
	f.Add([]byte("\x01\x02{}"), int64(1), int64(1))
	f.Add([]byte("\x01\x0d{\"st\":\"active\"}tail"), int64(-1), int64(1<<62))
	// the compact format (format 2)
	f.Add([]byte(r.EncodeAt(storeversion.CompactFormat)), int64(7), int64(5))
	f.Add([]byte(moved.EncodeAt(storeversion.CompactFormat)), int64(9), int64(5))
	f.Add([]byte(active.EncodeAt(storeversion.CompactFormat)), int64(1), int64(1))
	// the fields of storeversion.FewerKeys
	placed := active
	placed.PlacementKey = true
	placed.Committed = &CommittedReservation{ID: "5f2b7c1e-8d3a-4b6f-9e0c-1a2b3c4d5e6f", Until: time.Unix(1893456000, 7).UTC()}
	f.Add([]byte(placed.EncodeAt(storeversion.FewerKeys)), int64(3), int64(1))
	placed.Committed = &CommittedReservation{ID: "r-1", Until: time.Unix(-5, 0).UTC()}
	f.Add([]byte(placed.EncodeAt(storeversion.FewerKeys)), int64(3), int64(1))
	copied := *r
	copied.ObjectGen = 3
	f.Add([]byte(copied.Encode()), int64(40), int64(31))
	f.Add([]byte(copied.EncodeAt(storeversion.RowMoves)), int64(40), int64(31))
	f.Add([]byte{rowFormatCompact, 0}, int64(1), int64(1))
	f.Add([]byte{rowFormatCompact, 2, 0x28, 0x07}, int64(1), int64(1))
	f.Fuzz(func(t *testing.T, value []byte, modRev, createRev int64) {
		kv := &mvccpb.KeyValue{Key: []byte(fuzzRowKey), Value: value, ModRevision: modRev, CreateRevision: createRev}
		got, err := DecodeRow("actor/a1", kv)
		if err != nil {
			requireCorrupt(t, "decodeRow", err)
			return
		}
		_ = got.Snapshot(time.Unix(0, 0))
		// re-encoded in the format it was read in
		ver := storeversion.Base
		if value[0] == rowFormatCompact {
			ver = storeversion.CompactFormat
		}
		enc := got.EncodeAt(ver)
		again, err := DecodeRow("actor/a1", &mvccpb.KeyValue{Key: kv.Key, Value: []byte(enc), ModRevision: modRev, CreateRevision: createRev})
		if err != nil {
			t.Fatalf("re-encoded row %q does not decode: %v", enc, err)
		}
		if !reflect.DeepEqual(got, again) {
			t.Fatalf("row changed through encode: %+v, then %+v", got, again)
		}
		if again.EncodeAt(ver) != enc {
			t.Fatalf("row encoding is not a fixed point: %q, then %q", enc, again.EncodeAt(ver))
		}
	})
}

// FuzzRowRoundTrip encodes rows of arbitrary field values and requires them
// back unchanged — for valid UTF-8 text only: the row metadata is JSON, which
// replaces invalid UTF-8 with U+FFFD (a known codec limitation, reported).
func FuzzRowRoundTrip(f *testing.F) {
	f.Add("owner-a", int64(1), "mesh-1", "node-a", "type-a", "user_spot", int64(1), int64(2), int64(3), "r-1", "ref", []byte("sha"), []byte("payload"), true, false)
	f.Add("o", int64(1<<62), "m/\"x\"", "%2F", "\u2028", "actor", int64(0), int64(0), int64(0), "", "", []byte(nil), []byte{}, false, true)
	f.Add("\xff", int64(1), "m", "n", "t", "actor", int64(1), int64(1), int64(1), "\xfe", "r", []byte{0xff}, []byte{0}, true, true)
	f.Fuzz(func(t *testing.T, ownerID string, lease int64, mesh, rid, stable, kind string, actors, spots, typeCount int64,
		reservation, ref string, sha, payload []byte, reserved, pending bool) {
		validText := true
		for _, s := range []string{ownerID, mesh, rid, stable, kind, reservation, ref} {
			validText = validText && utf8.ValidString(s)
		}
		for _, ver := range []storeversion.Version{storeversion.Base, storeversion.CompactFormat, storeversion.FewerKeys} {
			if ver == storeversion.Base && !validText {
				continue // invalid UTF-8 text does not survive the JSON row metadata of format 1
			}
			roundTripRow(t, ver, ownerID, lease, mesh, rid, stable, kind, actors, spots, typeCount, reservation, ref, sha, payload, reserved, pending)
		}
	})
}

// roundTripRow is FuzzRowRoundTrip's check in the format of version ver.
func roundTripRow(t *testing.T, ver storeversion.Version, ownerID string, lease int64, mesh, rid, stable, kind string,
	actors, spots, typeCount int64, reservation, ref string, sha, payload []byte, reserved, pending bool) {
	t.Helper()
	{
		r := &Row{
			Key: "actor/a1", ModRev: 11, CreateRev: 3, OwnerGen: 4, Token: 10,
			Owner: authority.OwnerToken{OwnerID: ownerID, LeaseGeneration: lease},
			Alloc: authority.PlacementAllocation{
				State: authority.AllocationActive, ObjectKind: authority.ObjectKind(kind), StableType: stable,
				Descriptor: authority.NodeDescriptor{MeshName: mesh, RID: rid}, DescriptorLifecycleGeneration: lease,
				Capacity: authority.CapacityVector{Actors: actors, Spots: spots},
			},
			Payload: payload,
		}
		if payload == nil {
			r.Payload = []byte{}
		}
		if typeCount != 0 {
			r.Alloc.Capacity.SpotType = &authority.SpotTypeCapacity{ObjectKind: authority.ObjectKind(kind), StableType: stable, Count: typeCount}
		}
		if reserved {
			r.Alloc.State = authority.AllocationReserved
		}
		if ver >= storeversion.FewerKeys { // placed by its placement key; an active row names its commit
			r.PlacementKey = reserved != pending
			if !reserved {
				r.Committed = &CommittedReservation{ID: reservation, Until: time.Unix(lease, 1).UTC()}
			}
		}
		if pending {
			r.Pending = &authority.PendingCreation{ReservationID: reservation, RequestContentReference: ref, RequestSHA256: sha, RequestEncodedSize: int64(len(sha))}
			if sha == nil || len(sha) == 0 && ver >= storeversion.CompactFormat {
				r.Pending.RequestSHA256 = nil // protobuf bytes: empty reads as nil
			}
		}
		kv := &mvccpb.KeyValue{Key: []byte(fuzzRowKey), Value: []byte(r.EncodeAt(ver)), ModRevision: r.ModRev, CreateRevision: r.CreateRev}
		got, err := DecodeRow(r.Key, kv)
		if bad := storableRow(r); bad != nil {
			// a row no operation can store is refused when read back
			if !errors.Is(err, authority.ErrCorrupt) {
				t.Fatalf("a row with %v decoded: %v, %v", bad, got, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("decode of an encoded row: %v", err)
		}
		if !reflect.DeepEqual(r, got) {
			t.Fatalf("row round trip:\n got %+v\nwant %+v", got, r)
		}
		// the sentinel form resolves the owner generation and the token to
		// the ModRevision
		moved := *r
		moved.OwnerGen, moved.Token = 0, 0
		kv.Value = []byte(moved.EncodeAt(ver))
		got, err = DecodeRow(r.Key, kv)
		if err != nil || got.OwnerGen != r.ModRev || got.Token != r.ModRev {
			t.Fatalf("sentinel owner generation and token: %+v, %v", got, err)
		}
	}
}

// FuzzDecodeRecords decodes arbitrary reservation terminals, creation
// terminals and aggregate records: no panic, ErrCorrupt when refused, and an
// accepted record re-encodes to a fixed point.
func FuzzDecodeRecords(f *testing.F) {
	expires := time.Date(2030, 1, 2, 3, 4, 5, 6, time.UTC)
	f.Add([]byte(ReservationTerminal{State: "committed", ExpiresAt: expires}.Encode()))
	f.Add([]byte(EncodeTerminal(&authority.TerminalRecord{
		State: authority.TerminalCreated, ReservationID: "r-1", ObjectKind: authority.ObjectActor,
		Operation:        authority.CreationOperation{SourceNodeRID: "src", SourceNodeGeneration: 1, OperationID: authority.CreationOperationID{High: 1, Low: 2}},
		TerminalEnvelope: []byte("env"), TerminalEnvelopeSHA256: []byte{1}, ExpiresAt: expires, StoreNow: expires,
	})))
	agg := &AggregateRecord{State: AggregatePrepared, Request: authority.AggregatePrepareRequest{
		AggregateID: "agg-1", AggregateGeneration: 1, TargetOwner: authority.OwnerToken{OwnerID: "o", LeaseGeneration: 1},
		Capacity: authority.CapacityVector{Actors: 1}, InventoryDigest: []byte{9},
		Participants: []authority.AggregateParticipant{{AuthorityKey: "actor/a1", ExpectedStoreVersion: "7", OwnerTransition: authority.TransitionNewOwner, AuthorityPayload: []byte("p")}},
	}}
	f.Add([]byte(agg.Encode()))
	cross := *agg
	cross.Incarnation = "0123456789abcdef0123456789abcdef"
	f.Add([]byte(cross.Encode()))
	f.Add([]byte(RowLock{Fence: authority.Fence{AggregateID: "agg-1", AggregateGeneration: 1}, Incarnation: "0a", Attempt: "0b", Base: 3}.Encode()))
	f.Add([]byte(AggregatePart{Incarnation: "0a", Tokens: map[authority.Key]int64{"actor/a1": 0, "actor/b1": 9}}.Encode()))
	f.Add([]byte(EncodeTerminalAt(storeversion.FewerKeys, &authority.TerminalRecord{
		State: authority.TerminalRejected, ReservationID: "5f2b7c1e-8d3a-4b6f-9e0c-1a2b3c4d5e6f", ObjectKind: authority.ObjectActor,
		TerminalEnvelope: []byte("env"), ExpiresAt: expires, StoreNow: expires,
	})))
	f.Add([]byte("\x00\x02\x08\x01"))
	f.Add([]byte(`{"e":"2030-01-02T03:04:05+01:00","now":"0001-01-01T00:00:00Z"}`))
	f.Add([]byte(`{"e":"not a time"}`))
	f.Add([]byte{0x0f, 0xff, 0x81, 0x03, 0x01, 0x01})
	f.Add([]byte{})
	// values once taken for absent or expired records (issue 23)
	for _, v := range []string{`null`, `{}`, `{"st":"active","a":1e400}`, `{"s":"committed","e":"2030-01-01T00:00:00Z"} {}`} {
		f.Add([]byte(v))
	}
	f.Fuzz(func(t *testing.T, value []byte) {
		kv := func(v []byte) *mvccpb.KeyValue { return &mvccpb.KeyValue{Key: []byte("/ns/records/x"), Value: v} }

		if r, err := DecodeReservation(kv(value)); err != nil {
			requireCorrupt(t, "decodeReservation", err)
		} else {
			enc := r.Encode()
			again, err := DecodeReservation(kv([]byte(enc)))
			if err != nil || again.Encode() != enc {
				t.Fatalf("reservation %q re-encodes to %q, then %q, %v", value, enc, again.Encode(), err)
			}
		}

		// a creation terminal's key names its operation (the compact
		// format reads it from there); re-encoded in the format it was read
		// in
		term := func(v []byte) *mvccpb.KeyValue {
			return &mvccpb.KeyValue{Key: []byte("/ns/terminals/src/1/00000000000000010000000000000002"), Value: v}
		}
		if r, err := DecodeTerminal(term(value)); err != nil {
			requireCorrupt(t, "decodeTerminal", err)
		} else {
			ver := storeversion.Base
			if len(value) > 0 && value[0] == 0 {
				ver = storeversion.FewerKeys
			}
			enc := EncodeTerminalAt(ver, r)
			again, err := DecodeTerminal(term([]byte(enc)))
			if err != nil || EncodeTerminalAt(ver, again) != enc {
				t.Fatalf("terminal %q re-encodes to %q, then %v", value, enc, err)
			}
		}

		if l, err := DecodeRowLock(kv(value)); err != nil {
			requireCorrupt(t, "decodeRowLock", err)
		} else if again, err := DecodeRowLock(kv([]byte(l.Encode()))); err != nil || again != l {
			t.Fatalf("row lock %q re-decodes to %+v, %v", value, again, err)
		}

		if p, err := DecodeAggregatePart(kv(value)); err != nil {
			requireCorrupt(t, "decodeAggregatePart", err)
		} else if again, err := DecodeAggregatePart(kv([]byte(p.Encode()))); err != nil || again.Encode() != p.Encode() {
			t.Fatalf("part marker %q re-encodes to %q, then %v", value, p.Encode(), err)
		}

		if len(value) > 1<<16 {
			return // gob is not hardened against huge adversarial inputs (see report)
		}
		if a, err := DecodeAggregate(kv(value)); err != nil {
			requireCorrupt(t, "decodeAggregate", err)
		} else {
			enc := a.Encode()
			again, err := DecodeAggregate(kv([]byte(enc)))
			if err != nil || again.Encode() != enc {
				t.Fatalf("aggregate %q re-encodes to %q, then %v", value, enc, err)
			}
		}
	})
}

// storableRow says why no operation can store r (nil: one can), by the
// contract's own validators: the decoder must refuse exactly those rows.
func storableRow(r *Row) error {
	for _, t := range []struct{ v, name string }{
		{r.Owner.OwnerID, "owner"}, {r.Alloc.Descriptor.MeshName, "mesh"}, {r.Alloc.Descriptor.RID, "rid"},
	} {
		if err := authority.RequireText(t.v, t.name); err != nil {
			return err
		}
	}
	switch r.Alloc.ObjectKind {
	case authority.ObjectActor, authority.ObjectUserSpot, authority.ObjectInstanceSpot:
	default:
		return errors.New("object kind")
	}
	if r.Owner.LeaseGeneration < 0 {
		return errors.New("lease generation")
	}
	c := r.Alloc.Capacity
	for _, n := range []int64{c.Actors, c.Spots} {
		if n < 0 || n > 0x7fff_ffff {
			return errors.New("count")
		}
	}
	if st := c.SpotType; st != nil {
		if st.Count < 0 || st.Count > 0x7fff_ffff || !st.ObjectKind.IsSpot() || strings.IndexByte(st.StableType, 0) >= 0 || !utf8.ValidString(st.StableType) {
			return errors.New("spot type")
		}
	}
	if p := r.Pending; p != nil {
		if err := authority.RequireText(p.ReservationID, "reservation"); err != nil {
			return err
		}
	}
	if c := r.Committed; c != nil {
		if err := authority.RequireText(c.ID, "committed reservation"); err != nil {
			return err
		}
	}
	return nil
}
