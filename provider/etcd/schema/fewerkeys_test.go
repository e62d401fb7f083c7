package schema

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	authority "github.com/zlink-systems/authority"
	"github.com/zlink-systems/authority/provider/etcd/schema/internal/compactpb"
	"github.com/zlink-systems/authority/provider/etcd/storeversion"
)

// goldenCommittedRow is an active row of storeversion.FewerKeys: placed by
// its placement key, and naming the reservation that committed it.
func goldenCommittedRow() *Row {
	r := goldenRow(authority.AllocationActive)
	r.PlacementKey = true
	r.Committed = &CommittedReservation{ID: "5f2b7c1e-8d3a-4b6f-9e0c-1a2b3c4d5e6f", Until: goldenTime.Add(24 * time.Hour)}
	return r
}

// goldenCompactTerminal is goldenTerminal as the compact format gives it
// back: its digest is the envelope's (a completion's must be), its times
// are in UTC.
func goldenCompactTerminal() *authority.TerminalRecord {
	t := goldenTerminal()
	t.ReservationID = "5f2b7c1e-8d3a-4b6f-9e0c-1a2b3c4d5e6f"
	sum := sha256.Sum256(t.TerminalEnvelope)
	t.TerminalEnvelopeSHA256 = sum[:]
	return t
}

func kvAt(key, value string) *mvccpb.KeyValue {
	return &mvccpb.KeyValue{Key: []byte(key), Value: []byte(value), ModRevision: 12, CreateRevision: 5}
}

// TestFewerKeysFormat: the row fields and the compact creation terminal of
// storeversion.FewerKeys decode back to what was encoded; a terminal's
// operation comes from its key; a namespace before FewerKeys writes format-1
// terminals; a row with a FewerKeys field keeps it (in the compact format)
// whatever version its writer last learned, so a writer that has not yet
// seen the finalize cannot drop where the row's capacity is held.
func TestFewerKeysFormat(t *testing.T) {
	r := goldenCommittedRow()
	got, err := DecodeRow(r.Key, kvAt("/ns/rows/"+string(r.Key), r.EncodeAt(storeversion.FewerKeys)))
	require.NoError(t, err)
	require.True(t, got.PlacementKey)
	require.Equal(t, r.Committed.ID, got.Committed.ID)
	require.True(t, r.Committed.Until.Equal(got.Committed.Until))
	for v := storeversion.MinSupported; v <= storeversion.Latest; v++ {
		require.Equal(t, r.EncodeAt(storeversion.FewerKeys), r.EncodeAt(v), "version %s keeps the fields", v)
	}

	term := goldenCompactTerminal()
	key := NewLayout("/ns/").Terminal(term.Operation)
	compact := EncodeTerminalAt(storeversion.FewerKeys, term)
	require.True(t, compact[:2] == compactMarker)
	dec, err := DecodeTerminal(kvAt(key, compact))
	require.NoError(t, err)
	require.Equal(t, term.Operation, dec.Operation)
	require.Equal(t, term.ReservationID, dec.ReservationID)
	require.Equal(t, term.TerminalEnvelopeSHA256, dec.TerminalEnvelopeSHA256)
	require.True(t, term.ExpiresAt.Equal(dec.ExpiresAt) && term.StoreNow.Equal(dec.StoreNow))
	require.Less(t, len(compact), len(EncodeTerminal(term)))
	for v := storeversion.MinSupported; v < storeversion.FewerKeys; v++ {
		require.Equal(t, EncodeTerminal(term), EncodeTerminalAt(v, term), "version %s writes format 1", v)
	}
	// a reservation ID that is not a canonical UUID is kept as text
	for _, id := range []string{"r-1", "5F2B7C1E-8D3A-4B6F-9E0C-1A2B3C4D5E6F", "{5f2b7c1e-8d3a-4b6f-9e0c-1a2b3c4d5e6f}"} {
		term.ReservationID = id
		dec, err := DecodeTerminal(kvAt(key, EncodeTerminalAt(storeversion.FewerKeys, term)))
		require.NoError(t, err)
		require.Equal(t, id, dec.ReservationID)
	}
	// the operation is the key's: under a key naming none it is refused
	_, err = DecodeTerminal(kvAt("/ns/terminals/x", compact))
	require.ErrorIs(t, err, authority.ErrCorrupt)
}

// TestFewerKeysRefusedByCompactFormat: the fields FewerKeys adds to a
// compact row are unknown to a build that knows only CompactFormat, which
// refuses such a row; this build refuses what it does not know in them, and
// a malformed committed reservation or terminal.
func TestFewerKeysRefusedByCompactFormat(t *testing.T) {
	r := goldenCommittedRow()
	v := []byte(r.EncodeAt(storeversion.FewerKeys))
	n, sz := binary.Uvarint(v[1:])
	var m compactpb.Row
	require.NoError(t, proto.Unmarshal(v[1+sz:1+sz+int(n)], &m))
	require.True(t, m.PlacementKey)
	require.NotNil(t, m.Committed)
	// the fields are numbers 13 and 14: a build of CompactFormat knows
	// 1-12 and 15 (NextPretend's, refused by a released build)
	for _, f := range []protowire.Number{13, 14} {
		require.True(t, bytes.Contains(v, protowire.AppendTag(nil, f, map[protowire.Number]protowire.Type{13: protowire.VarintType, 14: protowire.BytesType}[f])))
	}
	frame := func(m *compactpb.Row) string {
		meta := marshalCompact(m)
		out := binary.AppendUvarint([]byte{rowFormatCompact}, uint64(len(meta)))
		return string(append(append(out, meta...), r.Payload...))
	}
	bad := map[string]func(m *compactpb.Row){
		"committed unknown field": func(m *compactpb.Row) {
			m.Committed.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 9, protowire.VarintType), 1))
		},
		"committed without an end":     func(m *compactpb.Row) { m.Committed.UntilSeconds, m.Committed.UntilNanos = 0, 0 },
		"committed nanoseconds":        func(m *compactpb.Row) { m.Committed.UntilNanos = 1e9 },
		"committed both forms":         func(m *compactpb.Row) { m.Committed.ReservationId = []byte("r-1") },
		"committed short UUID":         func(m *compactpb.Row) { m.Committed.ReservationUuid = []byte{1, 2, 3} },
		"committed empty":              func(m *compactpb.Row) { m.Committed.ReservationUuid = nil },
		"committed reserved row":       func(m *compactpb.Row) { m.State = compactpb.State_RESERVED },
		"committed reservation as NUL": func(m *compactpb.Row) { m.Committed.ReservationUuid, m.Committed.ReservationId = nil, []byte{0} },
	}
	for name, change := range bad {
		c := proto.Clone(&m).(*compactpb.Row)
		change(c)
		_, err := DecodeRow(r.Key, kvAt("k", frame(c)))
		require.ErrorIs(t, err, authority.ErrCorrupt, name)
	}

	term := goldenCompactTerminal()
	key := NewLayout("/ns/").Terminal(term.Operation)
	base := func() *compactpb.CreationTerminal {
		var m compactpb.CreationTerminal
		require.NoError(t, proto.Unmarshal([]byte(EncodeTerminalAt(storeversion.FewerKeys, term)[2:]), &m))
		return &m
	}
	badTerm := map[string]func(m *compactpb.CreationTerminal){
		"state":         func(m *compactpb.CreationTerminal) { m.State = 9 },
		"kind":          func(m *compactpb.CreationTerminal) { m.Kind = compactpb.Kind_USER_SPOT },
		"no expiry":     func(m *compactpb.CreationTerminal) { m.ExpiresSeconds, m.ExpiresNanos = 0, 0 },
		"no store time": func(m *compactpb.CreationTerminal) { m.NowSeconds, m.NowNanos = 0, 0 },
		"nanoseconds":   func(m *compactpb.CreationTerminal) { m.NowNanos = -1 },
		"reservation":   func(m *compactpb.CreationTerminal) { m.ReservationUuid = nil },
		"unknown field": func(m *compactpb.CreationTerminal) {
			m.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 20, protowire.VarintType), 1))
		},
	}
	for name, change := range badTerm {
		m := base()
		change(m)
		_, err := DecodeTerminal(kvAt(key, compactMarker+string(marshalCompact(m))))
		require.ErrorIs(t, err, authority.ErrCorrupt, name)
	}
	_, err := DecodeTerminal(kvAt(key, compactMarker+string(marshalCompact(base()))))
	require.NoError(t, err, "the unchanged terminal decodes")
}
