package linearizability

import (
	"fmt"
	"hash/fnv"
	"maps"
	"sort"
	"strings"

	"github.com/anishathalye/porcupine"

	"github.com/zlink-systems/authority"
)

// Op names an operation of the row contract.
type Op string

// Operations.
const (
	// OpRead reads the row: KindSnapshot with the row, or KindMissing.
	OpRead Op = "read"
	// OpPut replaces the active row whose payload is Expected by Payload:
	// KindStored, or KindConflict with the current row.
	OpPut Op = "put"
	// OpDelete deletes the active row whose payload is Expected: KindDeleted,
	// or KindConflict with the current row.
	OpDelete Op = "delete"
	// OpReserve creates a reserved row with Payload where none exists:
	// KindReserved with the reservation ID, KindAlreadyExists with the active
	// row, or KindConflict with the reserved row in the way.
	OpReserve Op = "reserve"
	// OpCommit turns the reserved row (ReservationID, payload Expected) active
	// with Payload: KindCommitted, KindAlreadyCommitted with the active row
	// when that reservation was committed before and the row is active, or
	// KindStale.
	OpCommit Op = "commit"
	// OpAbort deletes the reserved row (ReservationID, payload Expected):
	// KindAborted, KindAlreadyAborted when that reservation was aborted
	// before, or KindStale.
	OpAbort Op = "abort"
)

// Input is one operation's request.
type Input struct {
	Op  Op
	Key string
	// Expected is the payload of the version the client expects (OpPut,
	// OpDelete, OpCommit, OpAbort).
	Expected string
	// Payload is the unique payload written (OpPut, OpReserve, OpCommit).
	Payload string
	// ReservationID names the reservation (OpCommit, OpAbort).
	ReservationID string
}

// RowState is the state of a row.
type RowState string

// Row states.
const (
	Absent   RowState = ""
	Reserved RowState = "reserved"
	Active   RowState = "active"
)

// Row is a row as stored or observed. Its payload stands for its version.
type Row struct {
	State   RowState
	Payload string
	// ReservationID is set for a reserved row (empty in an observation that
	// did not see it).
	ReservationID string
}

// Output is one operation's observed outcome.
type Output struct {
	// Kind is the result kind, in the contract's vocabulary: KindSnapshot,
	// KindMissing, KindStored, KindDeleted, KindConflict, KindReserved,
	// KindAlreadyExists, KindCommitted, KindAlreadyCommitted, KindStale,
	// KindAborted or KindAlreadyAborted.
	Kind authority.ResultKind
	// Row is the row observed: the read row (KindSnapshot), the current row
	// (KindConflict, KindAlreadyExists; Absent when it was missing), the row
	// written (KindReserved with its ReservationID, KindAlreadyCommitted; and
	// optionally KindStored and KindCommitted, where the input implies it).
	// Unused for the other kinds.
	Row Row
	// Unknown marks an operation whose outcome is unknown; Check sets it for
	// operations recorded with History.Unknown.
	Unknown bool
}

// terminal is a reservation's end.
type terminal byte

const (
	committed terminal = 'c'
	aborted   terminal = 'a'
)

// state is one key's model state. It is never mutated once built.
type state struct {
	row       Row
	terminals map[string]terminal // reservation ID → terminal
}

// withTerminal returns a copy of terminals with id → t added.
func withTerminal(terminals map[string]terminal, id string, t terminal) map[string]terminal {
	next := make(map[string]terminal, len(terminals)+1)
	maps.Copy(next, terminals)
	next[id] = t
	return next
}

// apply runs in against s and returns the output the contract gives and the
// next state. An unknown reserve yields a reserved row with an unknown (empty)
// reservation ID.
func apply(s state, in Input) (Output, state) {
	r := s.row
	switch in.Op {
	case OpRead:
		if r.State == Absent {
			return Output{Kind: authority.KindMissing}, s
		}
		return Output{Kind: authority.KindSnapshot, Row: r}, s
	case OpPut:
		if r.State != Active || r.Payload != in.Expected {
			return Output{Kind: authority.KindConflict, Row: r}, s
		}
		next := Row{State: Active, Payload: in.Payload}
		return Output{Kind: authority.KindStored, Row: next}, state{row: next, terminals: s.terminals}
	case OpDelete:
		if r.State != Active || r.Payload != in.Expected {
			return Output{Kind: authority.KindConflict, Row: r}, s
		}
		return Output{Kind: authority.KindDeleted}, state{terminals: s.terminals}
	case OpReserve:
		switch r.State {
		case Active:
			return Output{Kind: authority.KindAlreadyExists, Row: r}, s
		case Reserved:
			return Output{Kind: authority.KindConflict, Row: r}, s
		}
		next := Row{State: Reserved, Payload: in.Payload}
		return Output{Kind: authority.KindReserved, Row: next}, state{row: next, terminals: s.terminals}
	case OpCommit:
		if s.terminals[in.ReservationID] == committed && r.State == Active {
			return Output{Kind: authority.KindAlreadyCommitted, Row: r}, s
		}
		if r.State != Reserved || r.ReservationID != in.ReservationID || r.Payload != in.Expected {
			return Output{Kind: authority.KindStale}, s
		}
		next := Row{State: Active, Payload: in.Payload}
		return Output{Kind: authority.KindCommitted, Row: next},
			state{row: next, terminals: withTerminal(s.terminals, in.ReservationID, committed)}
	case OpAbort:
		if s.terminals[in.ReservationID] == aborted {
			return Output{Kind: authority.KindAlreadyAborted}, s
		}
		if r.State != Reserved || r.ReservationID != in.ReservationID || r.Payload != in.Expected {
			return Output{Kind: authority.KindStale}, s
		}
		return Output{Kind: authority.KindAborted},
			state{terminals: withTerminal(s.terminals, in.ReservationID, aborted)}
	}
	return Output{Kind: "invalid op " + authority.ResultKind(in.Op)}, s
}

// resolve fills in the reservation ID of a reserved row whose reserve had an
// unknown outcome, from the first operation that names or observes it.
func resolve(s state, in Input, out Output) state {
	if s.row.State != Reserved || s.row.ReservationID != "" {
		return s
	}
	id := ""
	switch {
	case (in.Op == OpCommit || in.Op == OpAbort) && in.Expected == s.row.Payload && !out.Unknown &&
		(out.Kind == authority.KindCommitted || out.Kind == authority.KindAborted):
		id = in.ReservationID
	case (out.Kind == authority.KindSnapshot || out.Kind == authority.KindConflict) &&
		out.Row.State == Reserved && out.Row.Payload == s.row.Payload:
		id = out.Row.ReservationID
	}
	if id == "" {
		return s
	}
	return state{row: Row{State: Reserved, Payload: s.row.Payload, ReservationID: id}, terminals: s.terminals}
}

// step is porcupine's step function for one key.
func step(st, in, out any) (bool, any) {
	s, input, output := st.(state), in.(Input), out.(Output)
	s = resolve(s, input, output)
	want, next := apply(s, input)
	if output.Unknown {
		// Linearized here, it took effect; linearized after everything else,
		// it never did. The reservation ID of an unknown reserve is unknown.
		return true, next
	}
	if want.Kind != output.Kind {
		return false, s
	}
	if impliedRow(output) {
		output.Row = want.Row
	}
	if !sameRow(want.Row, output.Row) {
		return false, s
	}
	if input.Op == OpReserve && output.Kind == authority.KindReserved {
		next = state{row: output.Row, terminals: next.terminals}
	}
	return true, next
}

// impliedRow reports whether out may leave Row zero because the input
// determines it (the row a put or commit wrote).
func impliedRow(out Output) bool {
	return out.Row == (Row{}) && (out.Kind == authority.KindStored || out.Kind == authority.KindCommitted)
}

// sameRow compares an expected row with an observed one. An observation
// without a reservation ID matches any; the model's unknown (empty) ID
// matches any observed one.
func sameRow(want, got Row) bool {
	if want.State != got.State || want.Payload != got.Payload {
		return false
	}
	return want.ReservationID == "" || got.ReservationID == "" || want.ReservationID == got.ReservationID
}

func equal(a, b any) bool {
	x, y := a.(state), b.(state)
	return x.row == y.row && maps.Equal(x.terminals, y.terminals)
}

func hash(st any) uint64 {
	s := st.(state)
	h := fnv.New64a()
	fmt.Fprintf(h, "%s\x00%s\x00%s", s.row.State, s.row.Payload, s.row.ReservationID)
	sum := h.Sum64()
	for id, t := range s.terminals { // order-independent
		e := fnv.New64a()
		fmt.Fprintf(e, "%s\x00%c", id, t)
		sum += e.Sum64()
	}
	return sum
}

func partition(history []porcupine.Operation) [][]porcupine.Operation {
	byKey := map[string][]porcupine.Operation{}
	var keys []string
	for _, op := range history {
		k := op.Input.(Input).Key
		if _, ok := byKey[k]; !ok {
			keys = append(keys, k)
		}
		byKey[k] = append(byKey[k], op)
	}
	sort.Strings(keys)
	out := make([][]porcupine.Operation, 0, len(keys))
	for _, k := range keys {
		out = append(out, byKey[k])
	}
	return out
}

func describeRow(r Row) string {
	switch r.State {
	case Absent:
		return "absent"
	case Reserved:
		if r.ReservationID == "" {
			return fmt.Sprintf("reserved(%s)", r.Payload)
		}
		return fmt.Sprintf("reserved(%s, %s)", r.Payload, r.ReservationID)
	}
	return fmt.Sprintf("active(%s)", r.Payload)
}

func describeOperation(in, out any) string {
	input, output := in.(Input), out.(Output)
	var call string
	switch input.Op {
	case OpRead:
		call = fmt.Sprintf("read(%s)", input.Key)
	case OpPut:
		call = fmt.Sprintf("put(%s, %s→%s)", input.Key, input.Expected, input.Payload)
	case OpDelete:
		call = fmt.Sprintf("delete(%s, %s)", input.Key, input.Expected)
	case OpReserve:
		call = fmt.Sprintf("reserve(%s, %s)", input.Key, input.Payload)
	case OpCommit:
		call = fmt.Sprintf("commit(%s, %s, %s→%s)", input.Key, input.ReservationID, input.Expected, input.Payload)
	case OpAbort:
		call = fmt.Sprintf("abort(%s, %s, %s)", input.Key, input.ReservationID, input.Expected)
	default:
		call = string(input.Op)
	}
	if output.Unknown {
		return call + " → unknown"
	}
	switch output.Kind {
	case authority.KindSnapshot, authority.KindConflict, authority.KindAlreadyExists,
		authority.KindStored, authority.KindReserved, authority.KindCommitted, authority.KindAlreadyCommitted:
		return fmt.Sprintf("%s → %s %s", call, output.Kind, describeRow(output.Row))
	}
	return fmt.Sprintf("%s → %s", call, output.Kind)
}

func describeState(st any) string {
	s := st.(state)
	var b strings.Builder
	b.WriteString(describeRow(s.row))
	if len(s.terminals) > 0 {
		ids := make([]string, 0, len(s.terminals))
		for id := range s.terminals {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		b.WriteString(" terminals{")
		for i, id := range ids {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%s:%c", id, s.terminals[id])
		}
		b.WriteString("}")
	}
	return b.String()
}

// Model is the porcupine model of the authority row contract, partitioned
// by key. Every key starts absent.
var Model = porcupine.Model{
	Partition:         partition,
	Init:              func() any { return state{} },
	Step:              step,
	Equal:             equal,
	Hash:              hash,
	DescribeOperation: describeOperation,
	DescribeState:     describeState,
}
